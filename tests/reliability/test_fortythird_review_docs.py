"""Forty-third review of issue 15, the docs reviewer's findings that needed code (docs 15-17).

1. ``DPStrategy.start`` (the Flower strategy of ``simulate --engine flower``, of the deployment
   ServerApp and of a Flower app of one's own, such as ``examples/flower-app``) logs
   ``round N: epsilon=E cohort=M`` after every round. Case: ``flwr run examples/flower-app``
   (σ 0.7, q 0.2, δ 1e-3), round 3, ε 4.756095. Before: ``epsilon=4.756`` (``%.4g``, rounded to
   nearest, below what was spent; README promises every shown ε rounded up, and the app's own
   line shows 4.7561). After: ``epsilon=4.757`` (``core.text.epsilon_text``). Measured here on
   an in-process grid whose node hosts the users and fails every round (rounds of noise
   only, charged as sampled), no Flower or Ray started.
2. The deployment ServerApp's lines (``flwr log`` of ``flwr run .`` or of ``deploy local``:
   ``OUT/deploy/serverapp.log``), ``[fedprivopt] round N/T: epsilon=E ...`` and ``finished after
   N rounds (...): epsilon=E``. Case: ``deploy local simulations/toy.toml --nodes 1 --insecure
   --rounds 2``, ε 10.279828 after round 2. Before: ``epsilon=10.2798`` (``%.6g``, rounded to
   nearest, below what was spent). After: ``epsilon=10.2799`` (``epsilon_text(ε, 6)``). Measured
   through ``deploy.server_app.run_deployment`` on the same in-process grid (pushes and pulls),
   the app's default run config (the toy preset).
3. The same ServerApp process (``flwr-serverapp``, whose root logger has no handler). Case: the
   deployment of 2 above. Before: dp-accounting's first note on an RDP order it drops (absl's
   ``logging.warning``, six ``WARNING:absl:_compute_log_a_frac failed to converge`` lines in
   ``serverapp.log``) ran ``logging.basicConfig``, and every later Flower line was printed twice
   (``INFO:flwr:round 1: epsilon=7.551 cohort=9`` under Flower's own; examples/flower-app's own
   ServerApp does the same, left to the lead). After: ``deploy.server_app.main`` sets logging
   as ``cli.main`` does (absl at ``ERROR``, ``core.logs.log_warnings_to_stderr``). Measured
   with the root logger's handlers taken away for the call, as in that process.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedprivopt import wire as P
from fedprivopt.deploy.runconfig import app_config_defaults
from fedprivopt.deploy.server_app import run_deployment
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.messages import reply_metadata

POPULATION = 100
ROOT = Path(__file__).resolve().parents[2]


def _answer(msg: Message, population: int) -> Message:
    """Node 100's reply: every user to the user query, an error to a train message."""
    if msg.metadata.message_type == "query":
        users = ConfigRecord({P.USER_IDS: list(range(population))})
        return Message(RecordDict({P.USERS_RECORD: users}), metadata=reply_metadata(msg, 100))
    error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="no training here")
    return Message(error, metadata=reply_metadata(msg, 100))


class _SilentGrid:
    """One node (100) hosting every user; it answers the user query and fails every round."""

    def get_node_ids(self):
        return [100]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            replies.append(_answer(msg, POPULATION))
        return replies


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_1_the_strategys_round_line_shows_epsilon_rounded_up(server_side):
    config = StrategyConfig(
        strategy="dp-fedavg", population=POPULATION, clients_per_round=20, num_server_rounds=3,
        noise_multiplier=0.7, clip_norm=1.0, delta=1e-3, seed=0,
    )  # fmt: skip
    flat, spec = flatten({"w": torch.zeros(4)})
    strategy = DPStrategy(build_algorithm(config, flat), spec, node_wait=0.0)
    logger = logging.getLogger("flwr")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        strategy.start(_SilentGrid(), flat_to_arrays(flat, spec), num_rounds=3, timeout=1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    rounds = [line for line in handler.lines if line.startswith("round ")]
    assert rounds[0].startswith("round 1: epsilon=3.265 ")  # 3.264939, as before
    assert rounds[2].startswith("round 3: epsilon=4.757 ")  # 4.756095: was 4.756


class _PushPullGrid(_SilentGrid):
    """The same node, through the push and pull of Flower's deployment grid."""

    def __init__(self, population: int):
        self.population = population
        self.waiting: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            ids.append(msg.metadata.message_id)
            self.waiting[msg.metadata.message_id] = _answer(msg, self.population)
        return ids

    def pull_messages(self, message_ids):
        return [self.waiting.pop(i) for i in list(message_ids) if i in self.waiting]


def _flwr_lines(run) -> list[str]:
    logger = logging.getLogger("flwr")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.lines


def test_2_the_deployment_serverapp_shows_epsilon_rounded_up(server_side, tmp_path):
    run_config = app_config_defaults(ROOT)
    run_config.update({"out": str(tmp_path / "run"), "num-server-rounds": 2, "round-timeout": 1.0})
    context = Context(
        run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    grid = _PushPullGrid(int(run_config["population"]))
    lines = _flwr_lines(lambda: run_deployment(grid, context))
    rows = [line for line in lines if line.startswith("[fedprivopt] round ")]
    assert rows[0].startswith("[fedprivopt] round 1/2: epsilon=7.55085 ")  # 7.5508467, as before
    assert rows[1].startswith("[fedprivopt] round 2/2: epsilon=10.2799 ")  # 10.279828: was 10.2798
    (end,) = [line for line in lines if line.startswith("[fedprivopt] finished")]
    assert "epsilon=10.2799 at delta=0.0001" in end


def test_3_the_deployment_serverapp_prints_each_flower_line_once(server_side, tmp_path):
    from fedprivopt.deploy.server_app import main

    run_config = app_config_defaults(ROOT)
    # a sigma and rate of this test alone: the RDP curves are cached, and dp-accounting notes
    # the orders it drops only when it computes them
    run_config.update(
        {"out": str(tmp_path / "run"), "num-server-rounds": 2, "noise-multiplier": 0.4321}
    )
    run_config.update({"clients-per-round": 9.0})
    context = Context(
        run_id=8, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    root, absl = logging.getLogger(), logging.getLogger("absl")
    handlers, level = list(root.handlers), absl.level
    for handler in handlers:  # the flwr-serverapp process's root logger has none
        root.removeHandler(handler)
    absl.setLevel(logging.NOTSET)  # as in that process (another test may have set it)
    try:
        main(_PushPullGrid(int(run_config["population"])), context)
        added = list(root.handlers)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        absl.setLevel(level)
    # before: dp-accounting's first note (absl) ran logging.basicConfig, whose StreamHandler
    # printed every later Flower line a second time ('INFO:flwr:round 1: ...')
    assert not [h for h in added if type(h) is logging.StreamHandler]
