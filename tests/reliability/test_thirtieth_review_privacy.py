"""Issue 15, thirtieth hostile review (privacy-report area): regression tests of its findings.

1. ``fedprivopt epsilon --accountant prv --noise-multiplier 1e10 --sample-rate 0.5 --rounds 1``
   took ~19-28 s (Opacus sizes the PRV's domain with its own RDP accountant, which at q = 0.5
   and such σ takes seconds per call, three calls) to print ε = 0.0100 (its error bound), while
   σ 1e8 at q = 0.1 was refused (Opacus' RDP fails there: an infinite domain) and σ 1e10 at
   q = 0.1 accepted. The prv accountant now refuses, at once and for every q, a noise
   multiplier above Opacus' ``MAX_SIGMA`` (1e6, where Opacus' own search gives up): rc 2, one
   line advising rdp (or pld). The prv calibration never probed above it.
2. The Flower strategy logged a node's error reason whole (``node %s failed: %s`` and ``node %s
   failed the user query: %s``): a ClientApp's 1 MB reason was a 1 MB log line. Both are now
   cut as other echoed values are (``core.text.shown``).
3. ``summary.csv`` wrote std 0.0 for a group with one finite seed (the other diverged) beside
   ``seeds`` 2: a reader takes 0.0 for a measured std. ``rundata.mean_std`` now gives NaN for
   one value (no spread), written ``nan`` in the CSV (documented in ``write_summary_csv``);
   report.md shows the mean alone (the eval-loss cell, counted over all seeds, showed ``± 0``),
   and the plots draw no spread there.
4. report.md's "Privacy parameters" listed ``delta: varies (see the runs)`` (a non-private
   baseline's configured δ counted) beside a "δ" line of the private runs' one δ, and
   ``cohort-chunk`` (a simulation's batching of a cohort) as a privacy parameter because its
   name holds "cohort". The listed settings are now those of the private runs (when any), the
   ``delta`` key is left to the "δ" line, ``cohort-chunk`` is not listed, and ``population`` and
   ``clients-per-round`` (the sample rate) are.
5. (further variants of case 2: forged state and values at the Python API) A forged accountant
   state (``PrivacyAccountant.load_state_dict``) whose ``accountant``, ``prv_eps_error``,
   ``pld_discretization``, ledger event or ``sampling`` is a 100,000-character string or a
   100,000-element list was refused with a message holding it whole (100 KB to 689 KB), and so
   were ``ClipState.from_dict`` (an adaptive-clipping checkpoint's clip state),
   ``SubsampledGaussianEvent``, ``PrivacyAccountant(accountant=...)``, ``compose_epsilon``'s
   ``accountant``/``delta`` and ``calibrate_noise_multiplier``'s ``target_epsilon``/``tol``
   (57 of 57 cases), and likewise the refusals of ``privacy/``, ``strategies/``, ``clients/``,
   ``optim/`` and ``wire`` that wrote a value with ``!r``. They now show it as
   ``core.text.shown`` does (at most 80 characters); a short value reads as before.
6. The same for collections written whole: a forged tree state of 100,000 nodes
   (``TreeNoise.load_state_dict``: a 1.19 MB message listing them), an event dict with 100,000
   unknown fields (``SubsampledGaussianEvent.from_dict``), an optimizer state with 100,000
   unexpected keys (``optim.base.state_from_dict``), and a train config naming 100,000 users
   with a repeat (``wire.decode_train_config``, a hostile server to a ClientApp). An event or
   optimizer state whose unknown keys mixed integers and strings raised ``TypeError`` from
   ``sorted`` instead of the ``ValueError``. All are now shown cut, sorted by ``repr``.
7. (the other direction of the twenty-ninth review's finding 2) A train config from a server
   (``wire.decode_train_config``, what a ClientApp trains from) with users ``[0.5]``,
   ``[True]`` or ``["3"]`` was read as users 0, 1 and 3, and ``["a"]``/``[-1]`` gave int()'s
   message or user -1. The users must now be integers ``>= 0``, as ``read_user_ids`` takes them
   (``ValueError`` naming the key; numpy integers still taken).
8. ``ServerAlgorithm.load_state_dict`` (what ``--resume`` restores, and the Python API) with a
   state missing ``round``, ``params``, ``opt_state`` or ``accountant``, or a tree state missing
   ``noise`` or ``cohorts``, raised ``KeyError`` (``opt_state`` ``None``: ``TypeError`` from
   ``optim.base.state_from_dict``), and a ``user_offset`` of 100,000 characters was written
   whole. Each is now a ``ValueError`` naming what is missing, the offset shown cut.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from flwr.app import Error, Message, Metadata, RecordDict

from fedprivopt.privacy.accounting import compose_epsilon
from fedprivopt.privacy.events import SubsampledGaussianEvent
from fedprivopt.simulation.report import load_run, write_report
from fedprivopt.simulation.rundata_aggregate import mean_std
from fedprivopt.strategies import StrategyConfig, build_algorithm
from tests.reliability.test_twentyninth_review_privacy import QueryGrid, user_query_strategy
from tests.simulation.test_report import write_run

ROOT = Path(__file__).resolve().parents[2]


# -- finding 1: prv at a noise multiplier above Opacus' MAX_SIGMA ----------------------------------


@pytest.mark.parametrize(("sigma", "q"), [(1e10, 0.5), (1e8, 0.1), (1e10, 0.1), (2e6, 1e-3)])
def test_1_prv_refuses_a_noise_multiplier_above_opacus_max_sigma(sigma, q):
    event = SubsampledGaussianEvent(noise_multiplier=sigma, sample_rate=q, sampling="poisson")
    with pytest.raises(ValueError, match=r"noise_multiplier <= 1e\+06; use the rdp"):
        compose_epsilon([(event, 1)], 1e-5, accountant="prv")  # 1e10 at 0.5: ~19 s, 0.01
    # rdp (and pld) account it: ~0
    assert compose_epsilon([(event, 1)], 1e-5, accountant="rdp") < 1e-3


def test_1_prv_still_accounts_max_sigma_and_the_cli_refuses_in_one_line():
    from tests.reliability.test_fuzz_cli import run_cli

    event = SubsampledGaussianEvent(noise_multiplier=1e6, sample_rate=0.1, sampling="poisson")
    assert 0 <= compose_epsilon([(event, 1)], 1e-5, accountant="prv") <= 0.011
    argv = ["epsilon", "--accountant", "prv", "--noise-multiplier", "1e10", "--sample-rate", "0.5",
            "--rounds", "1", "--delta", "1e-5"]  # fmt: skip
    code, out, err = run_cli(argv)  # the command in this process: the refusal is the point
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "noise_multiplier <= 1e+06" in err and "Traceback" not in err


# -- finding 2: a node's error reason logged whole -------------------------------------------------

HUGE = "x" * 1_000_000


class FailingGrid(QueryGrid):
    """Node 100 answers the user query with an error whose reason is 1 MB."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for i, r in enumerate(replies):
            if r.metadata.src_node_id == 100:
                m = r.metadata
                metadata = Metadata(
                    run_id=1, message_id=m.message_id, src_node_id=100, dst_node_id=0,
                    reply_to_message_id=m.reply_to_message_id, group_id="", created_at=0.0,
                    ttl=60.0, message_type="query",
                )  # fmt: skip
                replies[i] = Message(Error(code=0, reason=HUGE), metadata=metadata)
        return replies


def test_2_a_node_error_reason_is_logged_cut(server_side, caplog):
    from tests.reliability.test_fuzz_replies import make_strategy, reply

    strategy = user_query_strategy()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert strategy.discover_users(FailingGrid(RecordDict())) == {2: 101, 3: 101}
        train = make_strategy()
        list(train.configure_train(1, None, None, None))
        train.aggregate_train(1, [reply(100, error=HUGE)])
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 2  # the query's and the round's
    assert max(len(m) for m in failed) < 300  # were 1,000,000 characters and more


# -- finding 3: one finite seed's std written 0.0 -----------------------------------------------


def test_3_one_finite_seed_has_no_std(tmp_path):
    assert math.isnan(mean_std([0.4, math.nan])[1]) and mean_std([0.4, 0.4])[1] == 0.0
    runs = [
        load_run(write_run(tmp_path, "dp-fedavg", 1.0, 0, final=0.5, final_loss=1.2)),
        load_run(write_run(tmp_path, "dp-fedavg", 1.0, 1, final=math.nan, final_loss=math.nan)),
    ]
    with pytest.warns(UserWarning):
        report = write_report(tmp_path / "out", runs, title="t", metric="eval_accuracy")
    with (tmp_path / "out" / "summary.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["seeds"] == "2"
    assert row["eval_accuracy_std"] == "nan" and row["eval_loss_std"] == "nan"  # were 0.0
    assert "± 0" not in report.read_text() and "± n/a" not in report.read_text()


# -- finding 4: the privacy parameters of report.md ---------------------------------------------


def _set_config(path: Path, **config) -> Path:
    summary = json.loads((path / "summary.json").read_text())
    summary["config"].update(config)
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_4_privacy_parameters_are_the_private_runs_and_no_cohort_chunk(tmp_path):
    common = {"cohort-chunk": 4, "population": 100, "clients-per-round": 10}
    runs = [
        _set_config(write_run(tmp_path, "dp-fedavg", 1.0, s, epsilon=3.0), delta=1e-5, **common)
        for s in (0, 1)
    ]
    runs.append(
        _set_config(write_run(tmp_path, "fedavg", 0.0, 0, epsilon=math.inf), delta=1e-6, **common)
    )
    report = write_report(tmp_path / "out", [load_run(p) for p in runs], title="t")
    text = report.read_text().split("## Privacy parameters")[1]
    assert "- δ: 1e-05" in text
    assert "varies" not in text  # was "- delta: varies (see the runs)"
    assert "cohort-chunk" not in text
    assert "- population: 100" in text and "- clients-per-round: 10" in text


# -- finding 5: refusals of forged state echo the value whole --------------------------------------

LONG = "x" * 100_000
WIDE = list(range(100_000))


def _forged(**fields):
    from fedprivopt.privacy.accounting import PrivacyAccountant

    acc = PrivacyAccountant()
    acc.step(SubsampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.1, sampling="poisson"))
    state = acc.state_dict()
    event = fields.pop("event", None)
    state.update(fields)
    if event is not None:
        state["ledger"][0]["event"].update(event)
    return lambda: PrivacyAccountant().load_state_dict(state)


@pytest.mark.parametrize("value", [LONG, WIDE], ids=["string", "list"])
def test_5_a_refused_forged_value_is_shown_cut(value):
    from fedprivopt.privacy.accounting import PrivacyAccountant
    from fedprivopt.privacy.adaptive_clip import ClipState
    from fedprivopt.privacy.calibration import calibrate_noise_multiplier

    event = SubsampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.1, sampling="poisson")
    calls = [
        _forged(accountant=value), _forged(prv_eps_error=value), _forged(pld_discretization=value),
        _forged(event={"sampling": value}), _forged(event={"noise_multiplier": value}),
        _forged(ledger=[{"event": value, "count": 1}]),
        lambda: ClipState.from_dict(value),
        lambda: SubsampledGaussianEvent(noise_multiplier=1, sample_rate=value, sampling="poisson"),
        lambda: SubsampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.1, sampling=value),
        lambda: PrivacyAccountant(accountant=value),
        lambda: compose_epsilon([(event, 1)], value),
        lambda: calibrate_noise_multiplier(
            target_epsilon=value, delta=1e-5, rounds=10, sample_rate=0.1
        ),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert len(str(info.value)) < 400  # were 100,000 to 689,000 characters


# -- finding 6: collections written whole ---------------------------------------------------------


def test_6_forged_collections_are_shown_cut():
    from fedprivopt.optim.adam import AdamState
    from fedprivopt.optim.base import state_from_dict
    from fedprivopt.privacy.rng import RngFactory
    from fedprivopt.privacy.tree import TreeNoise

    tree = TreeNoise(std=1.0, restart_rounds=8, rngs=RngFactory(seed=1), dim=1)
    zero = torch.zeros(1)
    event = {"noise_multiplier": 1.0, "sample_rate": 0.1, "sampling": "poisson"}
    calls = [
        lambda: tree.load_state_dict({"round": 1, "nodes": [[0, i, zero] for i in range(10**5)]}),
        lambda: SubsampledGaussianEvent.from_dict({**event, **{f"k{i}": 0 for i in range(10**5)}}),
        lambda: SubsampledGaussianEvent.from_dict({**event, 1: 0, "x": 0}),  # TypeError before
        lambda: state_from_dict(AdamState, {f"k{i}": 0 for i in range(10**5)}),
        lambda: state_from_dict(AdamState, {1: 0, "x": 0}),  # TypeError before
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert len(str(info.value)) < 400  # the first: 1,188,953 characters


def test_6_a_train_config_repeating_users_is_refused_cut():
    from fedprivopt import wire as P

    record = {key: 1 for key in P.REQUIRED_TRAIN_KEYS}
    record[P.USERS] = [*range(10**5), 0]
    with pytest.raises(ValueError, match="repeats a user id") as info:
        P.decode_train_config(record)
    assert len(str(info.value)) < 400


# -- finding 7: a train config's users -------------------------------------------------------------


@pytest.mark.parametrize("users", [[0.5], [True], ["3"], ["a"], [-1], [None]])
def test_7_a_train_config_with_users_that_are_no_ids_is_refused(users):
    from fedprivopt import wire as P

    record = {key: 1 for key in P.REQUIRED_TRAIN_KEYS}
    record[P.USERS] = users
    with pytest.raises(ValueError, match="must be a list of integers >= 0"):
        P.decode_train_config(record)  # [0.5], [True], ["3"], [-1]: users 0, 1, 3, -1


# -- finding 8: a server state missing a part ----------------------------------------------------


def _algorithm(**extra):
    config = StrategyConfig(
        strategy="dp-fedavg", population=4, clients_per_round=2, num_server_rounds=2,
        noise_multiplier=0.8, clip_norm=1.0, seed=5, **extra,
    )  # fmt: skip
    return lambda: build_algorithm(config, torch.zeros(3))


@pytest.mark.parametrize("part", ["round", "params", "opt_state", "accountant", "noise", "cohorts"])
def test_8_a_server_state_missing_a_part_is_refused(part):
    make = _algorithm(noise_mechanism="tree", tree_restart_rounds=2)
    state = make().state_dict()
    state["tree"] = dict(state["tree"])
    (state["tree"] if part in ("noise", "cohorts") else state).pop(part)
    with pytest.raises(ValueError):
        make().load_state_dict(state)  # KeyError before


def test_8_a_long_user_offset_is_shown_cut():
    make = _algorithm()
    state = make().state_dict()
    state["user_offset"] = "x" * 100_000
    with pytest.raises(ValueError, match="user_offset") as info:
        make().load_state_dict(state)
    assert len(str(info.value)) < 400
