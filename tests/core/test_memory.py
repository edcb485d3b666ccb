"""core.memory: glibc keeps freed memory for the next round once the engine asks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# a fresh interpreter: allocate 24 MB, touch it, free it, and print the resident size kept
PROBE = """
import os, sys
if sys.argv[1] == "keep":
    from fedprivopt.core.memory import keep_freed_memory
    print(keep_freed_memory(), keep_freed_memory())
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
before = rss()
block = bytearray(24 << 20)  # zero-filled: every page touched
del block
print(rss() - before)
"""


def _probe(mode: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
        env={**environ, **env}, timeout=60,
    )  # fmt: skip
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_memory_stays_in_the_process_once_asked():
    kept_by_default = int(_probe("default")[-1])
    ok, again, kept = _probe("keep")
    assert (ok, again) == ("True", "True")  # set once, then the same answer
    assert kept_by_default < 4 << 20  # glibc's default gives the 24 MB back at once
    assert int(kept) >= 20 << 20  # kept for the next allocation


def test_a_users_malloc_setting_is_left_alone():
    ok, _, kept = _probe("keep", MALLOC_TRIM_THRESHOLD_="0")
    assert ok == "False" and int(kept) < 4 << 20
