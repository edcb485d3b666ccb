"""Issue 15, thirty-seventh hostile review (the deployment and tree aggregation): regression tests.

1. ``flwr run . --run-config 'out=true'`` against a deployment (docs/DEPLOYMENT.md: ``out`` is
   the app's results directory), also ``out=5``, ``out=" "`` and an ``out`` with a line break
   pasted along: ``runconfig.run_config_from_flower`` took ``str()`` of the value, so the
   ServerApp wrote the run into ``./True``, ``./5`` or a directory named by a blank, where every
   other run-config key of a wrong type is refused naming the key (``seed = ""``: ``seed must be
   an integer >= 0``). Now a ``ValueError`` naming ``out``: a string, no control character, no
   blank path component (as ``--out`` is checked by the command line); the default and an
   ordinary path (with ``{run_id}``) are taken as before. The Python API ``deploy_local(...,
   out="runs/ /x")`` (which the command line's ``check_out_dir`` refuses) checks its ``out``
   the same way before anything is written or started (``local_checks.check_out``).
2. ``deploy local toy.toml --nodes 2 --insecure --rounds 8 --set noise-mechanism=tree --set
   tree-restart-rounds=4 --set round-timeout=90`` with SuperNode 1 stopped (SIGSTOP: alive, but
   off the SuperLink's connected nodes after its heartbeat lapsed) after round 1: under tree
   aggregation a round's cohort is taken among the users on connected nodes who have not taken
   part in the restart period, so once node 0's users of the second period were used (rounds 5
   and 6), rounds 7 and 8 had an empty cohort and released noise only, charged (``cohort_size``
   0, ``noise_std`` σC/m as usual), and the command ended rc 0 with ``8 rounds (rounds),
   eval_accuracy = 0.7100, epsilon = 31.57`` and no other word: the thirty-fifth review's
   warning skipped rounds that "sampled nobody", which under sampling is a draw, where a
   sampled user on no connected node is counted ``unhosted`` and named. Now a tree run's empty
   rounds count: ``warning: no sampled user's update reached the server in 2 of the 8 rounds,
   so the models released there are noise only, charged all the same (epsilon = 31.57): under
   tree aggregation no user who had not yet taken part in the restart period was on a connected
   node`` (rc 0 as before; sampled runs unchanged).
3. Python API: ``ParticipationLedger(5).check_in(0, [1.9])`` (the ledger behind tree
   aggregation's "each user at most once a period", docs/TREE.md; exported by
   ``fedprivopt.privacy.tree``) recorded user 1, and ``[-0.5]`` user 0: the ids were cast to
   int64, which truncates, so the user meant was not recorded and could check in again in the
   same period; ``[True]`` was user 1, ``["3"]`` raised torch's ``too many dimensions 'str'``.
   Now ``ValueError: user ids must be integers in [0, 5)`` and nothing recorded; integer
   lists, numpy and torch integer arrays and ranges are taken as before.
4. Python API: ``make_tls_files(directory, days=10**7)`` (docs/DEPLOYMENT.md: the CA and
   certificates for one's own deployment; also ``days=2**31``, ``2**63``) made the directory and
   then raised ``OverflowError: date value out of range`` (``Python int too large to convert to
   C int``). Now ``ValueError: days must be an integer in [1, N] (a certificate ends by the year
   9999)`` before the directory is made; ``N`` days work (a certificate to 9999-12-31).
5. Python API: ``make_tls_files(directory, hosts="10.0.0.5")`` (the SuperLink of a real
   deployment on another machine; one host given as a string) made a server certificate for
   the DNS names ``1``, ``0``, ``.`` and ``5``: every SuperNode's TLS handshake with
   10.0.0.5 would fail on a name mismatch, far from the cause; ``["10.0.0.5", ""]``, ``["my
   host"]`` and a name with a line break were written into the certificate as given, ``[5]``
   raised cryptography's ``TypeError``. Now ``ValueError`` naming ``hosts`` (a non-empty
   sequence, each an IP address or a DNS name) before anything is written; IPv4, IPv6,
   ``localhost``, wildcards and hyphenated names are taken as before.
6. Python API: ``make_node_key(directory, "../node0")`` (docs/DEPLOYMENT.md's node keys) wrote
   the private key outside ``directory``; ``""`` and ``"."`` raised ``IsADirectoryError``,
   ``"a/b"`` ``FileNotFoundError``, a line break was taken into the file name. Now
   ``ValueError: name must be one file name (no directory)`` before anything is written.
"""

from __future__ import annotations

import numpy
import pytest
import torch

from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.deploy.runconfig import app_config_defaults, run_config_from_flower

TOY = str(REPO_ROOT / "simulations" / "toy.toml")


@pytest.fixture(scope="module")
def app_keys():
    return app_config_defaults(REPO_ROOT)


@pytest.mark.parametrize("value", [True, 5, 1.5, " ", "runs/ /x", "runs\n", "a\x00b", ""])
def test_1_a_run_configs_out_that_is_no_path_is_refused_naming_out(app_keys, value):
    with pytest.raises(ValueError, match=r"^out\b") as err:
        run_config_from_flower({**app_keys, "out": value})
    assert "\n" not in str(err.value)


def test_1_an_ordinary_out_is_taken_as_before(app_keys):
    _, options = run_config_from_flower(app_keys)
    assert options.out == "runs/deploy/{run_id}"
    _, options = run_config_from_flower({**app_keys, "out": "~/my runs/{run_id}"})
    assert options.out == "~/my runs/{run_id}"


def test_1_deploy_local_refuses_such_an_out_before_anything_starts(tmp_path, monkeypatch):
    import fedprivopt.deploy.local as local

    def no_deployment():
        raise AssertionError("a deployment was started")

    monkeypatch.setattr(local, "make_workdir", no_deployment)
    for out in (tmp_path / " " / "x", f"{tmp_path}/a\nb"):
        with pytest.raises(ValueError, match=r"^argument --out: ") as err:
            local.deploy_local(nodes=1, tls=False, config_path=TOY, out=str(out))
        assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def _rows(tmp_path, rows):
    import json

    lines = [json.dumps({"round": i + 1, "epsilon": 1.0, **row}) for i, row in enumerate(rows)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_2_a_tree_round_whose_cohort_was_empty_is_named_in_the_warning(tmp_path):
    from fedprivopt.deploy.cli import _empty_rounds

    full = {"cohort_size": 10.0, "received": 10.0, "unhosted": 0.0}
    nobody = {"cohort_size": 0.0, "received": 0.0, "unhosted": 0.0}
    _rows(tmp_path, [full, full, nobody, nobody])
    summary = {"epsilon": 9.75, "noise_mechanism": "tree", "config": {"round-timeout": 3600}}
    warning = _empty_rounds(tmp_path, summary)
    assert warning is not None and "\n" not in warning
    assert "2 of the 4 rounds" in warning and "noise only" in warning
    assert "tree aggregation" in warning and "connected node" in warning
    # sampling: a round that sampled nobody is a draw of the sampler, not counted (as before)
    assert _empty_rounds(tmp_path, {**summary, "noise_mechanism": "gaussian"}) is None


@pytest.mark.parametrize("ids", [[1.9], [-0.5], [True], [True, 2], ["3"], [2**70], [[1, 2]]])
def test_3_the_participation_ledger_refuses_user_ids_that_are_no_integers(ids):
    from fedprivopt.privacy.tree import ParticipationLedger

    ledger = ParticipationLedger(5)
    with pytest.raises(ValueError, match=r"^user ids must be integers in \[0, 5\)"):
        ledger.check_in(0, ids)
    assert ledger.state_dict()["users"].tolist() == []  # nothing recorded
    ledger.check_in(0, numpy.array([1, 2]))
    ledger.check_in(0, [torch.tensor(3), numpy.int64(0)])
    ledger.check_in(0, range(4, 5))
    assert ledger.state_dict()["users"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("days", [10**7, 2**31, 2**63])
def test_4_make_tls_files_refuses_a_validity_past_the_year_9999_before_writing(tmp_path, days):
    from fedprivopt.deploy.tls import make_tls_files

    with pytest.raises(ValueError, match=r"^days must be an integer in \[1, \d+\] \(a cert"):
        make_tls_files(tmp_path / "tls", days=days)
    assert not (tmp_path / "tls").exists()


@pytest.mark.parametrize("hosts", ["10.0.0.5", ["10.0.0.5", ""], ["my host"], ["a\n"], [5]])
def test_5_make_tls_files_refuses_hosts_that_are_no_list_of_host_names(tmp_path, hosts):
    from fedprivopt.deploy.tls import make_tls_files

    with pytest.raises(ValueError, match=r"^hosts"):
        make_tls_files(tmp_path / "tls", hosts=hosts)
    assert not (tmp_path / "tls").exists()


@pytest.mark.parametrize("name", ["../node0", "", ".", "a/b", " ", "n\n", None])
def test_6_make_node_key_refuses_a_name_that_is_no_file_name(tmp_path, name):
    from fedprivopt.deploy.tls import make_node_key

    with pytest.raises(ValueError, match=r"^name must be one file name"):
        make_node_key(tmp_path / "keys", name)
    assert list(tmp_path.iterdir()) == []
    assert make_node_key(tmp_path / "keys", "node-0").private_key == tmp_path / "keys" / "node-0"
