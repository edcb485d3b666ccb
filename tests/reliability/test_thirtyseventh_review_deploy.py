"""Issue 15, thirty-seventh hostile review (the deployment and tree aggregation): regression tests.

1. ``flwr run . --run-config 'out=true'`` against a deployment (docs/DEPLOYMENT.md: ``out`` is
   the app's results directory), also ``out=5``, ``out=" "`` and an ``out`` with a line break
   pasted along: ``runconfig.run_config_from_flower`` took ``str()`` of the value, so the
   ServerApp wrote the run into ``./True``, ``./5`` or a directory named by a blank, where every
   other run-config key of a wrong type is refused naming the key (``seed = ""``: ``seed must be
   an integer >= 0``). Now a ``ValueError`` naming ``out``: a string, no control character, no
   blank path component (as ``--out`` is checked by the command line); the default and an
   ordinary path (with ``{run_id}``) are taken as before.
"""

from __future__ import annotations

import pytest

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
