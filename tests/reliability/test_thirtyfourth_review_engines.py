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
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedprivopt.cli import main
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
