"""Thirty-seventh review of issue 15 (ownapp): a user's own Flower app, ``examples/flower-app``.

The example's ServerApp (``main``) is driven in-process through a grid that runs the example's
own ClientApp handlers (``query``, ``train_users``) for two nodes, as ``flwr run`` would on
Flower's local simulation, without Ray.

Findings
--------
1. ``flwr run examples/flower-app --run-config 'strategy="dp2" dp2-s1=1 dp2-s2=1
   num-server-rounds=4'``: the ClientApp raised ``ValueError`` for every message carrying a
   preconditioner (DP2's adaptive rounds), so every node failed rounds 2 and 4; the strategy
   released them as noise only and charged them: the run ended normally with ε 6.05 after 4
   rounds, 2 of which trained nobody (``failed`` 6 and 4, ``received`` 0), though
   ``docs/FLOWER.md`` says the example "refuses such messages". Now the ServerApp refuses a
   strategy whose clients would get a preconditioner before anything is sent: ``ValueError: run
   config 'strategy' must be one whose clients need no preconditioner (...), got 'dp2'``; and
   the ClientApp answers such a message with the task's error (``reply_task_error``), so a
   ServerApp of one's own that sends one ends the run at that round instead of releasing it.
2. The app's own run-config keys were read unchecked: ``data-seed=1.5`` trained on data seed 1
   silently, ``data-seed="abc"`` raised ``int()``'s ``invalid literal`` naming no key;
   ``metrics-file`` naming a folder or a file in a missing folder raised ``IsADirectoryError`` /
   ``FileNotFoundError``; ``population=""`` (documented as "not set") made every ClientApp fail
   the user query with ``int()``'s message and the run end with "none of the 2 connected nodes
   hosts a user"; ``seed=18446744073709551616`` (taken by the strategy) raised torch's
   ``Overflow when unpacking long long``. Now ``flower_app.config`` checks each key (a
   ``ValueError`` naming it and its range, before the grid is used), ``population=""`` is the
   strategy's default on both sides, and ``build_model`` takes any seed ``>= 0``.
3. The example's ``metrics-file`` held every round's exact ``cohort_size``, ``received``,
   ``accepted``, ``mean_norm``, ... of the sampled users beside ε, with nothing saying ε does not
   cover them (``fedprivopt simulate``'s ``summary.json`` says so in ``not_covered`` since the
   twelfth review). Now its first row (written before round 1) and its final row carry
   ``not_covered``, naming those metrics (and the noise metrics in distributed-noise mode).
4. Ctrl-C of ``flwr run examples/flower-app --stream --run-config "num-server-rounds=30 ..."``
   after round 3 (Flower's behaviour): ``flwr run`` printed ``Exiting logstream`` and exited 0,
   while the run went on on the local SuperLink to round 30 (the ``metrics-file`` grew from 4 to
   32 rows after the Ctrl-C, ε spent to the end); the README said only that the SuperLink keeps
   running. It now says that Ctrl-C stops the log stream, not the run, and how to stop the run
   (``flwr stop <run-id>``, which answered ``Run … successfully stopped``).

Held (about 40 cases, not repeated here; replies of one's own through ``DPStrategy`` were tried
by the twenty-ninth and thirty-fourth reviews): see ``/tmp/notes/review37_ownapp_rows.md``.
"""

import json
import sys
import uuid
from pathlib import Path

import pytest
import tomllib
from flwr.app import Context, Error, Message, RecordDict

from fedprivopt.models.task import TaskError
from tests.messages import reply_metadata

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"
CONFIG = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
SMALL = {"population": 8, "clients-per-round": 1.0, "num-server-rounds": 2, "target-epsilon": ""}


@pytest.fixture
def example(monkeypatch):
    """The example's modules, imported from ``examples/flower-app``; Flower's run id set."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)
    monkeypatch.syspath_prepend(str(APP))
    import flower_app.client_app as client
    import flower_app.server_app as server
    import flower_app.task as task

    yield server, client, task
    for name in [m for m in sys.modules if m == "flower_app" or m.startswith("flower_app.")]:
        del sys.modules[name]


class AppGrid:
    """The part of Flower's Grid that ``DPStrategy`` uses; two nodes run the example's ClientApp."""

    def __init__(self, client, run_config):
        self.client, self.run_config, self.calls = client, run_config, 0

    def get_node_ids(self):
        self.calls += 1
        return [100, 101]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            node = msg.metadata.dst_node_id
            node_config = {"partition-id": node - 100, "num-partitions": 2}
            context = Context(1, node, node_config, RecordDict(), dict(self.run_config))
            handler = self.client.query if msg.metadata.message_type == "query" else None
            try:
                reply = (handler or self.client.train_users)(msg, context)
            except Exception as exc:  # as Flower answers a ClientApp's exception
                reply = Message(Error(code=2, reason=repr(exc)), reply_to=msg)
            reply.__dict__["_metadata"] = reply_metadata(msg, node)
            replies.append(reply)
        return replies


def _run(example, **overrides):
    server, client, _ = example
    run_config = {**CONFIG, **SMALL, **overrides}
    grid = AppGrid(client, run_config)
    server.main(grid, Context(1, 0, {}, RecordDict(), run_config))
    return grid


def test_1_a_strategy_with_a_preconditioner_is_refused_before_anything_is_sent(example):
    with pytest.raises(ValueError, match="run config 'strategy' must be one whose clients") as e:
        _run(example, strategy="dp2", **{"dp2-s1": 1, "dp2-s2": 1, "num-server-rounds": 4})
    assert "got 'dp2'" in str(e.value)


def test_1_the_client_app_answers_a_preconditioner_with_the_tasks_error(example, monkeypatch):
    server = example[0]
    monkeypatch.setattr(server, "check_no_preconditioner", lambda algorithm: None)
    rounds = []
    monkeypatch.setattr(server, "_append", lambda path, row: rounds.append(row))
    with pytest.raises(TaskError, match="does not precondition gradients"):
        _run(example, strategy="dp2", **{"dp2-s1": 1, "dp2-s2": 1, "metrics-file": ""})
    assert [row["round"] for row in rounds] == [0, 1]  # round 2 (adaptive) was not released


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data-seed", 1.5),
        ("data-seed", "abc"),
        ("data-seed", True),
        ("data-seed", -1),
        ("metrics-file", "."),
        ("metrics-file", "no-such-folder/m.jsonl"),
        ("metrics-file", 5),
    ],
)
def test_2_the_apps_own_keys_are_checked_before_the_grid_is_used(example, key, value):
    server, client, _ = example
    run_config = {**CONFIG, **SMALL, key: value}
    grid = AppGrid(client, run_config)
    with pytest.raises(ValueError, match=f"run config '{key}' must be"):
        server.main(grid, Context(1, 0, {}, RecordDict(), run_config))
    assert grid.calls == 0


def test_2_population_not_set_is_the_strategys_default_on_both_sides(example):
    _, client, _ = example
    context = Context(1, 100, {"partition-id": 1, "num-partitions": 2}, RecordDict(), {})
    default = {**CONFIG, "population": ""}
    context.run_config.update(default)
    from fedprivopt.strategies import StrategyConfig

    assert client._population(context) == StrategyConfig().population


def test_2_the_model_takes_every_seed_the_strategy_takes(example):
    task = example[2]
    model = task.build_model(2**64)
    assert sum(p.numel() for p in model.parameters()) > 0


class NoNodes(AppGrid):
    """A grid that ends the run where the strategy first asks for nodes."""

    def get_node_ids(self):
        raise RuntimeError("no nodes")


@pytest.mark.parametrize("mode", ["server", "distributed"])
def test_3_the_metrics_file_says_what_epsilon_does_not_cover(example, tmp_path, mode):
    server, client, _ = example
    path = tmp_path / "metrics.jsonl"
    run_config = {**CONFIG, **SMALL, "metrics-file": str(path), "noise-mode": mode}
    with pytest.raises(RuntimeError, match="no nodes"):
        server.main(NoNodes(client, run_config), Context(1, 0, {}, RecordDict(), run_config))
    (first,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert first["round"] == 0
    assert "mean_norm" in first["not_covered"] and "cohort_size" in first["not_covered"]
    assert ("topup_std" in first["not_covered"]) == (mode == "distributed")
    assert example[0].not_covered(example[0].strategy_config({"strategy": "fedavg"})) is None


def test_4_the_readme_says_ctrl_c_stops_only_the_log_stream():
    text = " ".join((APP / "README.md").read_text().split())
    assert "Ctrl-C of `flwr run --stream` stops only the log stream" in text
    assert "flwr stop <run-id>" in text
