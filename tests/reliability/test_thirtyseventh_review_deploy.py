"""Issue 15, thirty-seventh hostile review (the deployment and tree aggregation): regression tests.

1. ``flwr run . --run-config 'out=true'`` against a deployment (docs/DEPLOYMENT.md: ``out`` is
   the app's results directory), also ``out=5``, ``out=" "`` and an ``out`` with a line break
   pasted along: ``runconfig.run_config_from_flower`` took ``str()`` of the value, so the
   ServerApp wrote the run into ``./True``, ``./5`` or a directory named by a blank, where every
   other run-config key of a wrong type is refused naming the key (``seed = ""``: ``seed must be
   an integer >= 0``). Now a ``ValueError`` naming ``out``: a string, no control character, no
   blank path component (as ``--out`` is checked by the command line); the default and an
   ordinary path (with ``{run_id}``) are taken as before.
3. Python API: ``ParticipationLedger(5).check_in(0, [1.9])`` (the ledger behind tree
   aggregation's "each user at most once a period", docs/TREE.md; exported by
   ``fedprivopt.privacy.tree``) recorded user 1, and ``[-0.5]`` user 0: the ids were cast to
   int64, which truncates, so the user meant was not recorded and could check in again in the
   same period; ``[True]`` was user 1, ``["3"]`` raised torch's ``too many dimensions 'str'``.
   Now ``ValueError: user ids must be integers in [0, 5)`` and nothing recorded; integer
   lists, numpy and torch integer arrays and ranges are taken as before.
"""

from __future__ import annotations

import numpy
import pytest
import torch

from fedprivopt.deploy.local import REPO_ROOT
from fedprivopt.deploy.runconfig import app_config_defaults, run_config_from_flower


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
