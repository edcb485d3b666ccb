"""Thirty-fourth review of issue 15, area "engines": the fast engine, its Ray shards and Flower's.

Each test failed before its fix (checked against the code before it) and passes after.

1. ``simulate toy.toml --set fast-actors=2 --set ray-cpus=1`` (``ray-cpus``: "CPUs Ray may
   use"): accepted, and the shards' private Ray instance was started with 2 CPUs whatever
   ``ray-cpus`` said (``ray-cpus`` was read by the Flower engine only; a limit the user set to
   leave cores to others was exceeded silently); ``fast-actors=2 --set ray-cpus=3`` on this
   2-CPU machine was accepted too (the Flower engine refuses it), and each shard took
   ``os.cpu_count() // fast-actors`` torch threads whatever ``ray-cpus`` said. Now
   ``RunConfig`` refuses fewer ``ray-cpus`` than shards (each shard is an actor of one CPU:
   given fewer, the last shards would wait for a CPU for ever), rc 2 and one line
   ``fast-actors must be at most ray-cpus = 1 (...)``; ``check_flower_resources`` refuses
   ``ray-cpus`` above the machine's CPUs for ``fast-actors`` as for the Flower engine; and the
   shards' Ray instance gets ``max(fast-actors, ray-cpus)`` CPUs, split into the shards' torch
   threads (``fast._ray_actors``). An in-process run (``fast-actors = 0``) starts no Ray and
   still ignores ``ray-cpus``.
2. A shard that could not build the task while this process could: ``simulate toy.toml --set
   task=nodetask:make --set fast-actors=1``, whose factory raises ``MemoryError`` on a Ray worker
   only (as a task's module missing on a cluster's node does with ``ModuleNotFoundError``, or a
   package upgraded during a long run with ``ImportError: cannot import name …``, seen here
   when the working tree changed under a run): rc 2 and one line ``fast-actors: shard 1 of 1
   ended before it returned its users' updates of round 1 (ActorDiedError: The actor died
   because of an error raised in its creation task, ESC[36mray::_Shard.__init__()ESC[39m
   (pid=…, actor_id=…, repr=…)); killed, or out of memory …?``: Ray's terminal escapes, cut
   before the error, which it never named, and a guess at the cause. Now ``fast.shard_result``
   says ``fast-actors: shard 1 of 1 could not build the task (MemoryError: …), which this process
   built: its process or node differs (…)``, without escapes.
3. ``simulate toy.toml --engine flower --set fast-actors=2`` (also ``compare --engine flower`` of
   a preset with ``fast-actors``, and ``--resume`` of a ``fast-actors`` run whose ``config.toml``
   was switched to ``engine = "flower"``): accepted, and ``fast-actors`` ignored without a word
   (the Flower engine runs ``ray-cpus / client-cpus`` client actors), as ``ray-address`` on the
   fast engine in process was until the eighth review refused it. Now ``RunConfig`` refuses it,
   rc 2 and one line ``fast-actors 2 is used only by the fast engine (its shards); the flower
   engine runs each client as a Ray actor of client-cpus CPUs (set fast-actors = 0, or use the
   fast engine)``, before anything is written or Ray starts. (``vectorize = false`` is what the
   Flower engine does anyway, and ``cohort-chunk``, ``client-cpus``, ``round-timeout`` are
   documented as read by one engine only.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedprivopt.cli import main
from fedprivopt.simulation import fast
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.engines import check_flower_resources
from fedprivopt.simulation.fast import make_cohort_train

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# -- finding 1: ray-cpus with fast-actors ------------------------------------------------------


def test_1_fewer_ray_cpus_than_shards_is_refused_naming_both(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"fast-actors must be at most ray-cpus = 1 .*got 2"):
        load_config(TOY, {"fast-actors": 2, "ray-cpus": 1})
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]
    assert main([*argv, "--set", "fast-actors=2", "--set", "ray-cpus=1"]) == 2
    assert "fast-actors must be at most ray-cpus = 1" in _one_line(capsys)
    assert not out.exists()  # refused before anything is written or Ray starts
    # an in-process run starts no Ray: ray-cpus stays ignored there, as before
    load_config(TOY, {"ray-cpus": 1})


def test_1_ray_cpus_above_the_machine_is_refused_for_shards_too():
    machine = os.cpu_count() or 1
    config = load_config(TOY, {"fast-actors": 1, "ray-cpus": machine + 1})
    with pytest.raises(ValueError, match=rf"ray-cpus must be an integer in \[0, {machine}\]"):
        check_flower_resources(config)
    check_flower_resources(load_config(TOY, {"fast-actors": 1, "ray-cpus": machine}))
    check_flower_resources(load_config(TOY, {"ray-cpus": machine + 1}))  # in process: no Ray


class _Started(Exception):
    """Raised by the stand-in for ``ray.init``: what it was asked is in ``args``."""


def test_1_the_shards_ray_instance_gets_the_ray_cpus_asked(monkeypatch):
    import ray

    def init(**kwargs):
        raise _Started(kwargs)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(_Started) as started:
        make_cohort_train(None, device="cpu", actors=1, task_name="toy", task_params={}, ray_cpus=2)
    assert started.value.args[0]["num_cpus"] == 2  # was 1 (one a shard), whatever was asked


# -- finding 2: a shard that could not build the task --------------------------------------------


def test_2_a_shard_that_could_not_build_the_task_names_its_error(monkeypatch):
    import ray
    from ray.exceptions import ActorDiedError, RayTaskError

    error = ModuleNotFoundError("No module named 'mytask'")  # the task's module, not on a node
    trace = 'Traceback (most recent call last):\n  File "fast.py", line 340, in __init__\n'
    died = ActorDiedError(
        cause=RayTaskError(
            "_Shard.__init__", trace + f"ModuleNotFoundError: {error}", error,
            proctitle="ray::_Shard.__init__()", pid=7, ip="192.0.2.2",
        )
    )  # fmt: skip
    assert died.actor_init_failed and "\x1b[" in str(died)  # Ray's own text, as a shard gives

    def get(ref):
        raise died

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(ValueError) as info:
        fast.shard_result(object(), 1, 2, 4)
    text = str(info.value)
    assert text.startswith("fast-actors: shard 2 of 2 could not build the task ("), text
    assert "ModuleNotFoundError: No module named 'mytask'" in text and "round 4" in text, text
    assert "\x1b" not in text and "\n" not in text and "out of memory?" not in text, text


# -- finding 3: fast-actors on the Flower engine -------------------------------------------------


def test_3_fast_actors_on_the_flower_engine_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="fast-actors 2 is used only by the fast engine"):
        load_config(TOY, {"engine": "flower", "fast-actors": 2})
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--engine", "flower", "--rounds", "1", "--out", str(out)]
    assert main([*argv, "--quiet", "--set", "fast-actors=2"]) == 2
    line = _one_line(capsys)
    assert "fast-actors 2 is used only by the fast engine" in line and "client-cpus" in line
    assert not out.exists()  # before anything is written or Ray starts
    load_config(TOY, {"engine": "flower", "fast-actors": 0})  # the default stays accepted
