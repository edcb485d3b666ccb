"""The Flower strategy: a thin adapter between Flower messages and a :class:`ServerAlgorithm`.

:class:`DPStrategy` subclasses ``flwr.serverapp.strategy.Strategy``. It converts the global model
between ``ArrayRecord`` and the flat tensor once per message, and leaves sampling, clipping,
noise, the server optimizer and accounting to the engine-agnostic core, so the Flower engine and
the fast engine compute the same model.

Sampling is over **users**, not Flower nodes: at the start the strategy sends every node a
``query`` message and learns which users it hosts (:mod:`fedprivopt.strategies.discovery`);
each round it samples users by (seed, round) and sends each node one ``train`` message listing
the sampled users it hosts. Every user's clipped update comes back separately under
``update/<user>``.

Every sampled user of a round ends in exactly one of these round metrics (summed over the
cohorts of a round), so ``cohort_size = received + failed + timed_out + unavailable + dropped +
unhosted`` for a single-cohort strategy:

* ``received``: its update arrived (the aggregator then accepts or rejects it);
* ``failed``: its node answered with an error (the ClientApp raised, crashed or did not load);
* ``timed_out``: its node sent no reply before the round timeout;
* ``unavailable``: the SuperLink answered for the node that the node or its reply is unavailable
  (Flower error codes ``MESSAGE_UNAVAILABLE``, ``REPLY_MESSAGE_UNAVAILABLE``, ``NODE_UNAVAILABLE``);
* ``dropped``: its node replied without its update;
* ``unhosted``: no connected node hosts it (no message was sent).

``node_errors`` still counts error replies (nodes, not users) and ``unrequested`` updates under
keys nobody asked for. None of this changes the accounting, which follows the sampling.

A cohort whose every node asked answered with the task's error (code
:data:`~fedprivopt.clients.messages.TASK_ERROR`: the task breaks its protocol, the same on every
node) ends the run with that :class:`~fedprivopt.models.task.TaskError` before the round is
aggregated, as the fast engine stops at the first such user; a task error beside any other
outcome (an update, a time-out, another failure) is counted as ``failed`` like any error, unless
``stop_at_task_error`` (Flower's simulation engine, whose nodes all run the same task on the same
data) ends the run at the first one.

:meth:`DPStrategy.start` is overridden (same signature as Flower's) to add the user discovery, the
budget check before every round and the rounds with two cohorts (ADADP);
``configure_train``/``aggregate_train`` keep their Flower meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedprivopt import wire as P
from fedprivopt.clients.messages import TASK_ERROR
from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.flat import FlatSpec, flatten, unflatten
from fedprivopt.strategies.config import MAX_ROUNDS
from fedprivopt.strategies.core import ReportedUpdates, RoundResult, ServerAlgorithm, TrainRequest
from fedprivopt.strategies.discovery import UserDiscovery, task_failure

__all__ = [
    "LOSS_METRICS",
    "DPStrategy",
    "arrays_to_flat",
    "check_initial_arrays",
    "flat_to_arrays",
]

LOSS_METRICS = ("failed", "timed_out", "unavailable", "dropped", "unhosted")
"""Round metrics counting sampled users whose update did not arrive, by cause."""

# error replies that the SuperLink writes for a node (not the node's own failure)
_UNAVAILABLE = frozenset(
    {
        ErrorCode.MESSAGE_UNAVAILABLE,
        ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
        ErrorCode.NODE_UNAVAILABLE,
    }
)


def flat_to_arrays(flat: torch.Tensor, spec: FlatSpec) -> ArrayRecord:
    """ArrayRecord of the model state described by ``spec``."""
    return ArrayRecord({k: v.cpu() for k, v in unflatten(flat, spec).items()})


def arrays_to_flat(record: ArrayRecord) -> tuple[torch.Tensor, FlatSpec]:
    """Flat tensor (and spec) of an ArrayRecord holding a model state."""
    return flatten(record.to_torch_state_dict())


def check_initial_arrays(
    arrays: ArrayRecord, spec: FlatSpec, algorithm: ServerAlgorithm
) -> torch.Tensor:
    """The flat model of ``arrays``, which :meth:`DPStrategy.start` begins from.

    Thirty-sixth review of issue 15 (strategies, finding 2): only the flat length was compared,
    so a record of the model's tensors in another order (``{"b": ..., "a": ...}``), under other
    names or in float64 was taken, its values put into the model's tensors in the record's order
    (``a`` got ``b``'s first entries); and an algorithm restored from a checkpoint at round ``k``
    went on from whatever model was given (a Flower program's ``ArrayRecord(model.state_dict())``
    of its freshly built model), beside the checkpoint's optimizer state, average and ε.

    Raises
    ------
    ValueError
        For a record whose layout is not ``spec``'s, or, for an algorithm past round 0, whose
        values are not its parameters (NaN where its parameters hold NaN).
    """
    if not isinstance(arrays, ArrayRecord):
        raise ValueError(f"initial_arrays must be an ArrayRecord, got {shown(arrays)}")
    try:
        flat, given = arrays_to_flat(arrays)
    except ValueError as exc:
        raise ValueError(f"initial_arrays: {exc}") from None
    if given != spec:
        raise ValueError(
            "initial_arrays must hold the model's tensors as spec lists them (names, shapes and "
            f"dtypes in its order): {_first_difference(given, spec)}"
        )
    flat = flat.to(device=algorithm.params.device, dtype=algorithm.params.dtype)
    if flat.shape != algorithm.params.shape:
        raise ValueError("initial_arrays do not match the algorithm's model")
    if algorithm.round_num > 0:  # compared as the engines pass them: through an ArrayRecord
        ours = arrays_to_flat(flat_to_arrays(algorithm.params, spec))[0].to(flat)
        same = (flat == ours) | (flat.isnan() & ours.isnan())
        if not bool(same.all()):
            raise ValueError(
                f"initial_arrays must be the parameters of the algorithm, which is at round "
                f"{algorithm.round_num} (restored from a checkpoint): give "
                "flat_to_arrays(algorithm.params, spec), not another model "
                f"({int((~same).sum())} of {ours.numel()} entries differ)"
            )
    return flat


def _wire_preconditioner(preconditioner: torch.Tensor | None) -> np.ndarray | None:
    """The preconditioner as sent to clients: in its own dtype where numpy has it.

    Thirty-sixth review of issue 15 (strategies, finding 4): it was always sent as float32, so
    on a float64 model DP2's ``P = sqrt(v) + eps`` reached the clients rounded, and ``simulate
    --engine flower`` of ``dp2`` released another model than the fast engine from its first
    adaptive round on (the clients cast it to the model's dtype, which now restores it exactly).
    """
    if preconditioner is None:
        return None
    p = preconditioner.detach().cpu()
    if p.dtype not in (torch.float16, torch.float32, torch.float64):
        p = p.float()  # bfloat16 (numpy has none): float32 holds it exactly
    return p.numpy()


def _first_difference(given: FlatSpec, spec: FlatSpec) -> str:
    """Where the layout ``given`` first differs from ``spec`` (both differ somewhere)."""
    ours = list(zip(spec.names, spec.shapes, spec.dtypes, strict=True))
    theirs = list(zip(given.names, given.shapes, given.dtypes, strict=True))
    i = next((i for i, pair in enumerate(zip(theirs, ours, strict=False)) if len(set(pair)) > 1),
             min(len(ours), len(theirs)))  # fmt: skip

    def entry(items: list[tuple[str, tuple[int, ...], torch.dtype]]) -> str:
        if i >= len(items):
            return "nothing"
        name, shape, dtype = items[i]
        return f"{shown(name)} of shape {tuple(shape)} and {dtype}"

    return f"its tensor {i + 1} is {entry(theirs)}, the model's {entry(ours)}"


class DPStrategy(UserDiscovery, Strategy):
    """A fedprivopt server algorithm as a Flower strategy.

    Parameters
    ----------
    algorithm : ServerAlgorithm
        The server logic (see :func:`fedprivopt.strategies.build_algorithm`).
    spec : FlatSpec
        Layout of the model's state dict (names, shapes, dtypes) for ``ArrayRecord`` conversion.
    min_nodes : int
        Nodes that must be connected before user discovery, ``>= 1``.
    node_wait : float
        Seconds to wait for ``min_nodes`` before giving up, finite and ``>= 0``.
    on_round : callable, optional
        Called as ``on_round(result, eval_metrics)`` after every round (progress, metrics files).
    stop_at_task_error : bool
        End the run at the first node answering with the task's error
        (:data:`~fedprivopt.clients.messages.TASK_ERROR`), as the fast engine stops at the first
        such user: for Flower's simulation engine, whose nodes all run the same task on the same
        data. ``False`` (a deployment, whose nodes may hold other data): only when every node
        asked answered so.

    Raises
    ------
    ValueError
        Naming the parameter, for a value of the wrong type or outside its range (twenty-fifth
        review of issue 15: ``node_wait`` NaN or inf waited for ever for a user on no node,
        ``min_nodes`` 1.5, 0, -5, ``"2"`` or ``True`` and ``node_wait`` ``"3"`` were taken, and an
        ``on_round`` that is not callable failed after the first round).
    """

    def __init__(
        self,
        algorithm: ServerAlgorithm,
        spec: FlatSpec,
        *,
        min_nodes: int = 1,
        node_wait: float = 120.0,
        on_round: Callable[[RoundResult, dict[str, float] | None], None] | None = None,
        stop_at_task_error: bool = False,
    ) -> None:
        if not isinstance(algorithm, ServerAlgorithm):
            raise ValueError(f"algorithm must be a ServerAlgorithm, got {shown(algorithm)}")
        if not isinstance(spec, FlatSpec):
            raise ValueError(f"spec must be a FlatSpec, got {shown(spec)}")
        if on_round is not None and not callable(on_round):
            raise ValueError(f"on_round must be callable or None, got {shown(on_round)}")
        self.algorithm = algorithm
        self.spec = spec
        self.min_nodes = check_int("min_nodes", min_nodes, 1)
        self.node_wait = check_real("node_wait", node_wait, low=0.0)
        self.on_round = on_round
        if not isinstance(stop_at_task_error, bool):
            raise ValueError(f"stop_at_task_error must be a bool, got {shown(stop_at_task_error)}")
        self.stop_at_task_error = stop_at_task_error
        self.user_nodes: dict[int, int] = {}
        self._discovered = False
        self._last_result: RoundResult | None = None
        self._grid: Grid | None = None
        self._timeout = 3600.0
        self._round = None
        self._request: TrainRequest | None = None
        self._node_users: dict[int, list[int]] = {}
        self._sent: list[Message] = []
        self.node_errors = 0
        self.unrequested = 0
        self.lost: dict[str, int] = dict.fromkeys(LOSS_METRICS, 0)

    # -- Flower Strategy interface -------------------------------------------------------------

    def _messages(self, request: TrainRequest) -> list[Message]:
        by_node: dict[int, list[int]] = {}
        for user in request.users:
            node = self.user_nodes.get(user)
            if node is not None:
                by_node.setdefault(node, []).append(user)
            else:
                self.lost["unhosted"] += 1
        self._node_users = by_node
        arrays = flat_to_arrays(request.params, self.spec)
        preconditioner = _wire_preconditioner(request.preconditioner)
        messages = []
        for node, users in by_node.items():
            content = RecordDict(
                {
                    P.ARRAYS_RECORD: arrays,
                    P.CONFIG_RECORD: P.encode_train_config(
                        users=users,
                        round_num=request.round_num,
                        settings=request.settings,
                        stream=request.stream,
                    ),
                }
            )
            if preconditioner is not None:
                content[P.PRECONDITIONER_RECORD] = ArrayRecord(
                    {P.PRECONDITIONER_ARRAY: Array(preconditioner)}
                )
            messages.append(
                Message(
                    content=content,
                    dst_node_id=node,
                    message_type="train",
                    group_id=str(request.round_num),
                )
            )
        self._sent = messages  # the grid writes each message's id into it when it pushes it
        return messages

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample users for ``server_round`` and build one message per node hosting some."""
        self._grid = grid
        if not self._discovered:
            self.discover_users(grid)
        self.node_errors = 0
        self.unrequested = 0
        self.lost = dict.fromkeys(LOSS_METRICS, 0)
        if self.algorithm.tree_cohorts is not None:
            # tree aggregation: the round's cohort comes from users on connected nodes who have
            # not taken part in this restart period (the algorithm's participation ledger)
            connected = set(grid.get_node_ids())
            self.algorithm.available_users = {
                user for user, node in self.user_nodes.items() if node in connected
            }
        self._round = self.algorithm.run_round(server_round)
        self._request = next(self._round)
        return self._messages(self._request)

    def _reply_node(self, reply: Message, sent: dict[str, int]) -> int | None:
        """The node a reply answers, or ``None``.

        By the id of the message it replies to (the SuperLink's own error replies have the
        SuperLink as sender), else by its sender if that node was asked this cohort.
        """
        node = sent.get(reply.metadata.reply_to_message_id)
        if node is None and reply.metadata.src_node_id in self._node_users:
            node = reply.metadata.src_node_id
        return node

    def _updates(self, replies: Iterable[Message]) -> dict[int, Any]:
        """``{user: flat update}`` from train replies; nothing a client sends can raise here.

        An update that cannot be decoded into a tensor (missing ``delta``, undecodable bytes, an
        unsupported serialization or byte order) maps to ``None``, which the aggregator rejects
        and counts; an update under a key that was not requested from that node (another
        node's user, an unknown id, a non-canonical key) is dropped and counted in
        ``unrequested``. Users whose update did not arrive are counted by cause in
        :attr:`lost` (see the module docstring); this is called once per cohort, right after
        ``send_and_receive`` of that cohort's messages.

        Raises
        ------
        TaskError
            When every node asked answered with the task's error, or one did with
            ``stop_at_task_error`` (:func:`~fedprivopt.strategies.discovery.task_failure`).
        """
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent}
        sent.pop("", None)
        answered: set[int] = set()
        errored: set[int] = set()
        task_errors: dict[int, str] = {}  # said below, unless they end the run
        updates = ReportedUpdates()
        for reply in replies:
            node = self._reply_node(reply, sent)
            if node is not None and node in answered:
                continue  # a second reply to one message: the first one counts
            if node is not None:
                answered.add(node)
            if reply.has_error():
                self.node_errors += 1
                if node is not None and reply.error.code == TASK_ERROR:
                    task_errors[node] = str(reply.error.reason)
                else:
                    log(WARNING, "node %s failed: %s", node, shown(reply.error.reason))
                if node is not None:
                    errored.add(node)
                    cause = "unavailable" if reply.error.code in _UNAVAILABLE else "failed"
                    self.lost[cause] += len(self._node_users[node])
                continue
            if node is None:
                node = reply.metadata.src_node_id
            for key, record in reply.content.array_records.items():
                if not key.startswith(P.UPDATE_PREFIX):
                    continue
                user = P.parse_update_key(key)
                if user is None or user not in self._node_users.get(node, []):
                    self.unrequested += 1
                    log(
                        WARNING,
                        "node %s sent an update under an unrequested key %s",
                        node,
                        shown(key),
                    )
                    continue
                updates[user] = None  # unless decoded below; the aggregator rejects and counts it
                if P.DELTA_ARRAY not in record:
                    continue
                try:
                    array = np.array(record[P.DELTA_ARRAY].numpy(), copy=True)
                    updates[user] = torch.from_numpy(array)
                except Exception as exc:  # hostile bytes: np.load and torch raise many types
                    log(WARNING, "node %s: undecodable update of user %d: %s", node, user, exc)
                if P.CLIP_BIT_ARRAY in record:  # checked by the round (adaptive clipping)
                    try:
                        updates.clip_bits[user] = np.array(
                            record[P.CLIP_BIT_ARRAY].numpy(), copy=True
                        )
                    except Exception:  # undecodable: the round rejects the reply
                        updates.clip_bits[user] = "undecodable"
        every = task_errors.keys() == self._node_users.keys()
        if task_errors and (every or self.stop_at_task_error):
            where = (
                "asked" if self._request is None else f"asked in round {self._request.round_num}"
            )
            raise task_failure(task_errors, len(self._node_users), where)
        for node, reason in task_errors.items():
            log(WARNING, "node %s failed: %s", node, shown(reason))
        for node, users in self._node_users.items():
            if node not in answered:
                self.lost["timed_out"] += len(users)
                log(WARNING, "node %s sent no reply within %g s", node, self._timeout)
            elif node not in errored:
                self.lost["dropped"] += sum(1 for u in users if u not in updates)
        return updates

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Feed the replies to the round; run further cohorts (ADADP) through the grid."""
        if self._round is None:
            raise RuntimeError("aggregate_train called before configure_train")
        try:
            updates = self._updates(replies)
            while True:
                request = self._round.send(updates)
                messages = self._messages(request)
                replies = self._grid.send_and_receive(messages, timeout=self._timeout)
                updates = self._updates(replies)
        except StopIteration as stop:
            result: RoundResult = stop.value
        finally:
            self._round = None  # a task's error ends the round unaggregated
        for user, reason in sorted(result.rejected.items()):
            log(WARNING, "round %d: rejected the update of user %d: %s", server_round, user, reason)
        result.metrics["node_errors"] = float(self.node_errors)
        result.metrics["unrequested"] = float(self.unrequested)
        result.metrics.update({k: float(v) for k, v in self.lost.items()})
        metrics = {k: float(v) for k, v in result.metrics.items() if np.isfinite(v)}
        self._last_result = result
        return flat_to_arrays(result.params, self.spec), MetricRecord(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client-side evaluation: the server evaluates centrally (not covered by DP)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    def summary(self) -> None:
        """Log the configuration and the threat model."""
        c = self.algorithm.config
        log(INFO, "\t├── fedprivopt strategy: %s", c.strategy)
        if c.tree:
            log(
                INFO,
                "\t├── user-level DP: sigma=%g, C=%g, tree aggregation (no sampling): %d users a "
                "round, each at most once per restart period of %d rounds, delta=%g",
                c.noise_multiplier,
                c.clip_norm,
                int(c.clients_per_round),
                c.restart_rounds,
                c.delta,
            )
        elif c.private:
            log(
                INFO,
                "\t├── user-level DP: sigma=%g, C=%g, q=%g (%s sampling), delta=%g",
                c.noise_multiplier,
                c.clip_norm,
                c.sample_rate,
                c.sampling,
                c.delta,
            )
            if c.adaptive:
                log(
                    INFO,
                    "\t├── adaptive clipping: C starts at %g, quantile %g, rate %g, count noise "
                    "%g; update noise multiplier %g (sum and count together: sigma)",
                    c.clip_norm,
                    c.clip_quantile,
                    c.clip_learning_rate,
                    c.count_stddev,
                    c.update_noise_multiplier,
                )
            log(
                INFO,
                "\t└── noise: %s",
                "added by the (trusted) server"
                if c.noise_mode == "server"
                else "distributed shares from clients, topped up by the server",
            )
        else:
            log(INFO, "\t└── NOT private: no clipping, no noise")

    # -- the run loop --------------------------------------------------------------------------

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds (fewer if the privacy budget stops the run).

        ``initial_arrays`` must have the layout of ``spec`` (its names, shapes and dtypes, in its
        order); before the first round they are the model the run starts from (used as given),
        and for an algorithm restored at a later round they must be its parameters
        (``flat_to_arrays(algorithm.params, spec)``): :func:`check_initial_arrays`.
        ``num_rounds`` is an integer in ``[1, MAX_ROUNDS]`` and ``timeout`` a finite number of
        seconds ``> 0`` (twenty-fifth review of issue 15: -1 rounds ran none and said the rounds
        were done; a timeout of NaN, 0 or -1 was taken, and Flower's grid then waits for no
        reply, so every update of the round is lost). ``train_config`` and ``evaluate_config``
        are ignored: client settings come from the algorithm's configuration.
        """
        num_rounds = check_int("num_rounds", num_rounds, 1, MAX_ROUNDS)
        timeout = check_real("timeout", timeout, low=0.0, low_open=True)
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ValueError(f"evaluate_fn must be callable or None, got {shown(evaluate_fn)}")
        self._timeout = timeout
        self._grid = grid
        alg = self.algorithm
        alg.params = check_initial_arrays(initial_arrays, self.spec, alg)
        self.summary()
        result = Result(arrays=initial_arrays)
        if evaluate_fn is not None:
            res = evaluate_fn(alg.round_num, initial_arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[alg.round_num] = res
        self.discover_users(grid)
        for server_round in range(alg.round_num + 1, num_rounds + 1):
            if not alg.budget_allows_next_round():
                alg.stopped_reason = "budget"
                log(
                    INFO,
                    "stopping before round %d: it would exceed target epsilon %g",
                    server_round,
                    alg.config.target_epsilon,
                )
                break
            replies = grid.send_and_receive(
                self.configure_train(server_round, result.arrays, ConfigRecord(), grid),
                timeout=self._timeout,
            )
            arrays, metrics = self.aggregate_train(server_round, replies)
            result.arrays = arrays
            result.train_metrics_clientapp[server_round] = metrics
            eval_metrics = None
            if evaluate_fn is not None:
                res = evaluate_fn(server_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
                    eval_metrics = dict(res)
            log(
                INFO,
                "round %d: epsilon=%.4g cohort=%d",
                server_round,
                self._last_result.metrics.get("epsilon", float("inf")),
                int(self._last_result.metrics.get("cohort_size", 0)),
            )
            if self.on_round is not None:
                self.on_round(self._last_result, eval_metrics)
        else:
            alg.stopped_reason = "rounds"
        return result
