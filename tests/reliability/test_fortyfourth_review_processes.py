"""Issue 15, forty-fourth hostile review (processes: signals, locks and processes): tests.

1. A joined Ray cluster's head lost during a run of ``compare`` or ``tune`` (``--set
   fast-actors=1 --set ray-address=H:P``; each cell or trial joins the cluster and is watched by
   ``cluster_watch.HeadWatch``). Before: the run ended with ``... its last checkpoint is kept:
   resume the run (--resume) once the cluster is back``, rc 2; neither command has
   ``--resume`` (``compare ... --resume``: ``unrecognized arguments``), the same command
   continues them. Now the line says so too (``HeadWatch.line``). (In-process: a watch of a
   port nothing listens on, with a short grace, its line captured; no Ray.)
"""

from __future__ import annotations

import socket
import threading

from fedprivopt.simulation.cluster_watch import HeadWatch


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_1_a_lost_head_says_how_compare_and_tune_continue():
    said: list[str] = []
    done = threading.Event()

    def lost(line: str) -> None:
        said.append(line)
        done.set()

    watch = HeadWatch(f"127.0.0.1:{_closed_port()}", "ray-address", interval=0.01, grace=0.02,
                      on_lost=lost)  # fmt: skip
    with watch:
        assert done.wait(10.0)
    (line,) = said
    assert "resume the run (--resume)" in line  # simulate's way, as before
    assert "a compare or tune: run the same command again" in line
    assert "\n" not in line
