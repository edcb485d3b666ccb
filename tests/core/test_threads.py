"""OpenMP threads wait passively in the command line's process (issue 19, NOTES.md entry 13)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401  (loaded before the call, as in any process that imported it)

from fedprivopt.core.threads import OMP_WAIT_POLICY, passive_openmp_wait


def _env_without_policy() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(OMP_WAIT_POLICY, None)
    return env


def _fresh(code: str, env: dict[str, str]) -> list[str]:
    """The words ``code`` prints in a new interpreter (torch not loaded) with ``env``."""
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
        check=True,
    ).stdout.split()  # fmt: skip


CALL = (
    "from fedprivopt.core.threads import passive_openmp_wait\n"
    "first = passive_openmp_wait()\n"
    "import os, torch\n"
    "print(first, os.environ['OMP_WAIT_POLICY'])\n"
)


def test_sets_passive_before_torch_loads_and_keeps_the_users_value():
    assert _fresh(CALL, _env_without_policy()) == ["True", "PASSIVE"]
    assert _fresh(CALL, {**_env_without_policy(), OMP_WAIT_POLICY: "ACTIVE"}) == ["False", "ACTIVE"]


def test_leaves_the_environment_alone_once_torch_is_loaded(monkeypatch):
    monkeypatch.delenv(OMP_WAIT_POLICY, raising=False)
    assert "torch" in sys.modules
    assert passive_openmp_wait() is False
    assert OMP_WAIT_POLICY not in os.environ


def test_the_command_line_sets_it_before_importing_torch():
    # an import hook records the variable at the moment torch is first imported
    code = (
        "import os, sys\n"
        "seen = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and not seen:\n"
        "            seen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
        "sys.meta_path.insert(0, Spy())\n"
        "from fedprivopt.cli import main\n"
        "rc = main(['epsilon', '--noise-multiplier', '1', '--sample-rate', '0.01',\n"
        "           '--rounds', '10', '--delta', '1e-5'])\n"
        "print('RESULT', rc, seen)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env_without_policy(), capture_output=True, text=True,
        timeout=300, check=True,
    ).stdout  # fmt: skip
    assert "RESULT 0 ['PASSIVE']" in out, out
