"""The Flower ClientApp: a thin adapter from messages to :class:`~fedprivopt.clients.LocalTrainer`.

The message formats are defined in :mod:`fedprivopt.wire`. Each node hosts a set of
users (:func:`~fedprivopt.wire.hosted_users`); the server asks which (``query``), then
asks each node to train the sampled users it hosts (``train``) and gets every user's clipped update
back separately. In DP mode a train reply carries nothing else than the updates and two counts the
server already knows (users trained, users rejected); the private per-user example counts and
training losses are sent only when the server asks for them (non-private baselines).

The task is rebuilt in every process from the Flower app's run config (``task``, its parameters
as the ``task-params.<key>`` keys Flower flattens the ``[task-params]`` table into or as
``task-params-json``, optional ``device``: :func:`fedprivopt.wire.task_params`) and cached per
process together with its trainer, so a Ray worker builds it once. The same function reads them
for the ServerApp, so both build the same task. :func:`make_client_app` can supply a default
task for runs whose run config has none (``flwr.simulation.run_simulation`` passes an empty run
config).

A handler that finds the task breaking its protocol (:class:`~fedprivopt.models.task.TaskError`:
``user_data`` or ``loss`` of another form, a model with nothing to train) answers with
:func:`~fedprivopt.clients.messages.reply_task_error` instead of raising, so the server reads the
task's error (not Ray's traceback) and ends the run with it when every node asked failed so. The
reply names the task's member and the exception's type (or what was expected), nothing of a
user's data; the node logs the error whole, with its traceback (forty-sixth review of issue 15,
the follow-up's privacy 1: the reason was the error's text, a user's example count or a token of
their data).

The ``evaluate`` handler measures the received model on the node's users' *training* data. Its
reply (losses, accuracies, example counts) is **not** covered by the DP guarantee; the server's
central evaluation on held-out data is the default.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import DEBUG, ERROR

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from fedprivopt import wire as P
from fedprivopt.clients.messages import (
    TrainMessage,
    check_record_kinds,
    hosted_users,
    read_model,
    reply_task_error,
    reply_updates,
    reply_users,
)
from fedprivopt.clients.privatize import keep_as_noised
from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.core.logs import hide_engine_notices
from fedprivopt.core.text import shown
from fedprivopt.models.registry import build_task, check_task_name
from fedprivopt.models.task import Task, TaskError, state_to_flat
from fedprivopt.models.task_calls import (
    NODE_LOG,
    out_of_memory,
    sent_as,
    task_call,
    user_examples,
)
from fedprivopt.privacy.rng import RngFactory

__all__ = ["app", "clear_cache", "get_task_and_trainer", "make_client_app"]

_CACHE: dict[tuple[str, str, str], tuple[Task, LocalTrainer]] = {}
_LOCK = threading.Lock()


def _canonical_params(params: str | Mapping[str, object] | None) -> str:
    """``params`` as the canonical JSON text of their snake_case names (the cache's key).

    Forty-third review of issue 15 (wire 2): a JSON string repeating a key
    (``'{"num_users": 4, "num_users": 6}'``) built the task of the last one, and a mapping of
    two spellings (``num-users``, ``num_users``) a task that failed at the first message, where
    the run config's ``task-params-json`` refuses both; a value JSON cannot hold (a ``Path``)
    raised ``TypeError`` naming no parameter.
    """
    if params is None or params == "":
        return "{}"
    if isinstance(params, str):
        params = P.json_object("task_params", params)  # a repeated key is refused
    if not isinstance(params, Mapping):
        raise ValueError(f"task_params must be a JSON object, got {shown(params)}")
    snake = P.snake_case_params("task_params", params)
    try:
        return json.dumps(snake, sort_keys=True)
    except (TypeError, ValueError) as err:  # a Path, a set, a cycle
        raise ValueError(
            f"task_params must hold JSON values (numbers, strings, booleans, lists and objects): "
            f"{shown(str(err))}"
        ) from None


def get_task_and_trainer(
    task: str, task_params: str | Mapping[str, object] | None = None, device: str = "auto"
) -> tuple[Task, LocalTrainer]:
    """Return the process-wide cached ``(task, trainer)`` for these parameters.

    Parameters
    ----------
    task : str
        Registered task name.
    task_params : str or Mapping, optional
        Keyword parameters, as a mapping or a JSON object string.
    device : str
        ``"auto"`` (:func:`~fedprivopt.clients.trainer.default_device`) or a torch device string.
    """
    key = (str(task), _canonical_params(task_params), str(device))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            built = build_task(key[0], **json.loads(key[1]))
            trainer = LocalTrainer(built, device=None if key[2] == "auto" else key[2])
            hit = _CACHE[key] = (built, trainer)
    return hit


def clear_cache() -> None:
    """Forget the cached tasks and trainers of this process."""
    with _LOCK:
        _CACHE.clear()


@dataclass(frozen=True)
class _Defaults:
    task: str | None
    task_params: str
    device: str


def _task_for(context: Context, defaults: _Defaults) -> tuple[Task, LocalTrainer]:
    run_config = context.run_config
    if P.RUN_TASK in run_config:
        name = str(run_config[P.RUN_TASK])
        params: str | Mapping[str, object] = P.task_params(run_config)
    elif defaults.task is not None:
        name, params = defaults.task, defaults.task_params
    else:
        raise ValueError(
            f"the run config has no {P.RUN_TASK!r} key and the ClientApp has no default task "
            "(use make_client_app(task=...))"
        )
    device = str(run_config.get(P.RUN_DEVICE, defaults.device))
    return get_task_and_trainer(name, params, device)


def _hosted(context: Context, task: Task) -> list[int]:
    return hosted_users(context, task.num_users)


def _query(message: Message, context: Context, defaults: _Defaults) -> Message:
    task, _ = _task_for(context, defaults)
    return reply_users(message, _hosted(context, task))


def _task_model(state: Mapping[str, torch.Tensor], trainer: LocalTrainer) -> torch.Tensor:
    """The message's model on the task's flat layout, or the task's error when it is another.

    A model of other names or shapes than the task's (a ServerApp of one's own whose state dict
    says ``_orig_mod.weight``, as a compiled model's does) is the same on every node: answered
    with :func:`reply_task_error`, so the server ends the run when every node asked says so.
    Forty-fourth review of issue 15 (wire 5): the ``ValueError`` was a node's failure, and the
    run released noise-only rounds, charged, to its end (3 rounds, epsilon 8.94, rc 0).
    """
    try:
        return state_to_flat(state, trainer.spec)
    except ValueError as err:
        said = str(err) if len(str(err)) <= 1000 else shown(str(err))  # as the server shows it
        text = (
            f"the message's model is not the model of the node's task "
            f"({type(trainer.task).__name__}): {said}"
        )
        raise sent_as(TaskError(text), text) from None  # the two models' names, no user's data


def _reordered(
    flat: torch.Tensor, layout: tuple[tuple[str, int], ...], names: Iterable[str]
) -> torch.Tensor:
    """``flat`` (laid out as ``layout``: names, sizes) with its tensors in ``names``' order.

    The names are the same (``state_to_flat`` checked them); the entries are moved, not computed,
    so the norm of an update is unchanged. The same order gives ``flat`` itself.
    """
    names, given = list(names), [name for name, _ in layout]
    if given == names:
        return flat
    pieces = dict(zip(given, torch.split(flat, [size for _, size in layout]), strict=True))
    return torch.cat([pieces[name] for name in names])


def _train(message: Message, context: Context, defaults: _Defaults) -> Message:
    task, trainer = _task_for(context, defaults)
    hosted = set(_hosted(context, task))
    request = TrainMessage.read(message)
    global_flat = _task_model(request.state, trainer)
    # the server reads every update (and lays the preconditioner out) in its model's key order
    # (forty-fourth review of issue 15, wire 1: sent in the node's, bias before weight on the
    # server added weight's update to bias)
    ours = tuple(zip(trainer.spec.names, trainer.spec.sizes, strict=True))
    theirs = tuple((name, tensor.numel()) for name, tensor in request.state.items())
    preconditioner = request.preconditioner
    if preconditioner is not None:
        preconditioner = _reordered(preconditioner, theirs, trainer.spec.names)
    if request.secure:
        rngs = RngFactory(seed=None, secure=True)
    else:
        rngs = RngFactory(seed=request.seed)

    updates: dict[int, torch.Tensor] = {}
    clip_bits: dict[int, float] = {}
    rejected = 0
    num_examples: list[int] = []
    losses: list[float] = []
    failures: dict[int, Exception] = {}
    for user in request.users:
        if user not in hosted:
            rejected += 1
            continue
        try:
            result = trainer.train(
                global_flat,
                user_id=user,
                round_num=request.round_num,
                config=request.local,
                rngs=rngs,
                preconditioner=preconditioner,
                stream=request.stream,
            )
        except Exception as exc:  # this user's alone; see _failed_alone
            failures[user] = exc
            continue
        updates[user] = _reordered(result.delta, ours, request.state)
        if request.local.noise_std > 0:
            keep_as_noised(updates[user], request.local.noise_std)  # entries moved, not computed
        if result.clip_bit is not None:
            clip_bits[user] = result.clip_bit
        num_examples.append(result.num_examples)
        losses.append(result.loss)
    if failures:
        _failed_alone(failures, trained=bool(updates))
    return reply_updates(
        message,
        updates,
        rejected=rejected,
        clip_bits=clip_bits,
        num_examples=num_examples,
        losses=losses,
    )


def _failed_alone(failures: dict[int, Exception], *, trained: bool) -> None:
    """Drop the users whose training failed, each alone; raise when no user of the node trained.

    Forty-seventh review of issue 15 (egress 5): one user's failure (a task error on a damaged
    record, ``epoch_orders``' limit on a user's example count, the memory a user's examples
    need) failed the whole node, and in a deployment (whose nodes host many users) the round
    was released without the node's other sampled users: with users 1, 4 and 7 on a node and C
    0.1, the released sums with and without user 4 differed by users 1 and 7's updates (norm
    0.150, 1.5 C; up to k C for k users on a node), a change epsilon does not cover. Now a user
    whose training raised is left out of the reply alone (the server counts it ``dropped``), so
    a user's data changes the sum by their own clipped update at most. The error is logged
    whole on the node (as :func:`_replying` logs a node's). When no user of the node trained,
    the first error is raised as before (a task broken for every user still ends the run as
    the task's error; the Flower simulation's nodes host one user each, so its
    ``stop_at_task_error`` is unchanged).
    """
    if not trained:
        raise next(iter(failures.values()))
    for user, exc in failures.items():
        what = "the task's error" if isinstance(exc, TaskError) else type(exc).__name__
        log(ERROR, "user %s left out of the round's reply: %s: %s", user, what, exc)
        log(DEBUG, "the traceback of the error above:", exc_info=exc)


def _known_spellings(kind: str, names: Iterable[str], known: str) -> None:
    """``ValueError`` for a name of ``names`` that is ``known`` in another spelling."""
    for name in names:
        if P.other_spelling(name, (known,)) is not None:
            raise ValueError(
                f"evaluate message's {kind} {shown(name)} is {known!r} in another spelling; the "
                f"{kind} is {known!r}"
            )


def _evaluate(message: Message, context: Context, defaults: _Defaults) -> Message:
    content = message.content
    # a config of another kind (a MetricRecord) was ignored as one spelled otherwise ('Config',
    # 'Users') was: every hosted user evaluated where the server named some (forty-fifth review
    # of issue 15, wire 4; forty-sixth, wire 4)
    check_record_kinds(content, "evaluate", (P.ARRAYS_RECORD,), (P.CONFIG_RECORD,))
    config = content.config_records.get(P.CONFIG_RECORD)
    _known_spellings("ConfigRecord", content, P.CONFIG_RECORD)
    _known_spellings("config key", config or {}, P.USERS)
    asked = None
    if config is not None and P.USERS in config:  # as a train config's (thirty-first review)
        asked = P.check_user_ids(f"evaluate config {P.USERS!r}", config[P.USERS])
    task, trainer = _task_for(context, defaults)
    hosted = _hosted(context, task)
    allowed = set(hosted)
    users = hosted if asked is None else [u for u in asked if u in allowed]
    state = read_model(message)  # names an unreadable array (forty-third review, wire 3)
    global_flat = _task_model(state, trainer)
    loss_sum, acc_sum, total = 0.0, 0.0, 0
    for user in users:
        x, y = user_examples(task, user)  # checked as the trainer checks it
        n = int(x.shape[0])
        if n == 0:
            continue
        # the model as built, loaded for each user (forty-third review of issue 15, wire 5): a
        # forward that keeps what it saw (a running mean) carried one user's data into the next
        # user's metrics, so users [4, 1] reported accuracy 0.382 and [1, 4] 0.5
        model = trainer.load_global(global_flat)
        loss, accuracy = _user_metrics(task, model, x, y)
        loss_sum += loss * n
        acc_sum += accuracy * n
        total += n
    record = MetricRecord(
        {
            P.EVAL_LOSS: loss_sum / total if total else 0.0,
            P.EVAL_ACCURACY: acc_sum / total if total else 0.0,
            P.EVAL_NUM_EXAMPLES: total,
        }
    )
    return Message(RecordDict({P.EVAL_METRICS: record}), reply_to=message)


def _user_metrics(
    task: Task, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """``task.evaluate_data(model, x, y)``'s loss and accuracy, or the task's error.

    Forty-sixth review of issue 15 (wire 3): the evaluate handler called it unchecked, the one
    member of a task no engine checks, so a task returning its metrics as tensors (a loss of
    ``cross_entropy``) ended in Flower's ``TypeError: Not all values are of valid type``, one
    without ``"accuracy"`` in ``KeyError: 'accuracy'``, a string in ``TypeError: unsupported
    operand``, each naming neither the task nor the metric, and ``sys.exit(0)`` in it ended the
    ClientApp with ``SystemExit``. Now each is the task's error (:func:`reply_task_error`), as
    ``user_data`` and ``loss`` are in training; a number of any kind (a one-value tensor too,
    as ``evaluate()``'s metrics are read) is taken as a float.
    """
    call = f"{type(task).__name__}.evaluate_data(model, x, y)"
    rule = f"{call} must return a mapping with the numbers 'loss' and 'accuracy'"
    with task_call(call, rule):
        metrics = task.evaluate_data(model, x, y)
    # what is sent names the rule only (the follow-up's privacy 1): the node logs what was got
    if not isinstance(metrics, Mapping):
        raise sent_as(TaskError(f"{rule}; got {type(metrics).__name__!r}"), rule)
    values = []
    for name in ("loss", "accuracy"):
        if name not in metrics:
            raise sent_as(
                TaskError(
                    f"{rule}; got none for {name!r}, keys {shown(sorted(map(str, metrics)))}"
                ),
                rule,
            )
        value = metrics[name]
        try:
            if isinstance(value, (str, bytes, bool)):
                raise TypeError
            if isinstance(value, torch.Tensor):
                value = value.detach()  # a loss with its graph: no warning of torch's
            values.append(float(value))
        except (TypeError, ValueError, OverflowError, RuntimeError):  # RuntimeError: a tensor
            error = TaskError(f"{rule}; got a {type(value).__name__} for {name!r}")
            raise sent_as(error, rule) from None
    return values[0], values[1]


def _replying(
    handler: Callable[[Message, Context, _Defaults], Message],
    message: Message,
    context: Context,
    defaults: _Defaults,
) -> Message:
    """``handler``'s reply, or the task's error as :func:`reply_task_error`'s reply.

    The error is logged whole on the node (Flower's logger, where Flower logs a ClientApp's
    exception): one line at ``ERROR``, its traceback at ``DEBUG`` (a SuperNode's level; the
    simulation's nodes print on the command's standard error, which ends in one line); the
    reply names the member and the exception's type, nothing of a user's data.
    """
    try:
        return handler(message, context, defaults)
    except TaskError as exc:
        kind = message.metadata.message_type
        log(ERROR, "the task's error answering a %s message: %s", kind, exc)
        log(DEBUG, "the traceback of the task's error above:", exc_info=exc)
        return reply_task_error(message, exc)
    except Exception as exc:
        if not out_of_memory(exc):
            raise  # the message's own errors: their text names what the server sent
        # forty-sixth review of issue 15, follow-up privacy 2: torch's allocator says the bytes it
        # asked for ("you tried to allocate 960000000 bytes": a user's examples), which Flower
        # sends as the error reply's reason; a node's failure as before, without them
        kind = message.metadata.message_type
        log(ERROR, "out of memory answering a %s message: %s", kind, exc)
        log(DEBUG, "the traceback of the error above:", exc_info=exc)
        raise MemoryError(
            f"the node ran out of memory answering a {kind} message ({type(exc).__name__}); "
            f"{NODE_LOG}"
        ) from None


def _check_device_name(device: object) -> None:
    """``ValueError`` naming ``device`` unless it is ``"auto"`` or a device (name) torch reads.

    Whether the machine has the device is checked where the task is built (the node's). Forty-
    third review of issue 15 (wire 6): ``device=None`` (``LocalTrainer``'s own default), ``5``
    or ``"meta"`` was taken, and every node then failed every message naming no parameter of
    this call (``device must be a torch.device ... got 'None'``), the run ending after
    ``node_wait`` with "none of the connected nodes hosts a user".
    """
    if isinstance(device, str) and device == "auto":
        return
    try:
        named = isinstance(device, (str, torch.device))
        readable = named and torch.device(device).type != "meta"
    except (RuntimeError, TypeError, ValueError):
        readable = False
    if not readable:
        raise ValueError(
            "device must be 'auto' or the name of a device that holds data, such as 'cpu' or "
            f"'cuda:0', got {shown(device)}"
        )


def make_client_app(
    *,
    task: str | None = None,
    task_params: str | Mapping[str, object] | None = None,
    device: str = "auto",
) -> ClientApp:
    """Return a ClientApp with fedprivopt's ``query``, ``train`` and ``evaluate`` handlers.

    Parameters
    ----------
    task : str, optional
        Default task name, used when the run config has no ``task`` key (e.g. under
        ``flwr.simulation.run_simulation``, whose run config is empty). The run config wins.
    task_params : str or Mapping, optional
        Default task parameters (mapping or JSON object string), used with ``task``.
    device : str
        Default training device (``"auto"``, ``"cpu"``, ``"cuda"``, ...); the run config's
        ``client-device`` wins.

    Notes
    -----
    The handlers are module-level functions bound with :func:`functools.partial`, so pickling the
    app (Ray does, for every message) does not copy this process's task cache.
    """
    if task is not None:
        check_task_name(task)  # a registered name or a reference "package.module:factory"
    _check_device_name(device)
    hide_engine_notices()  # in a Ray actor too: loading the app there calls this
    defaults = _Defaults(task, _canonical_params(task_params), str(device))
    client_app = ClientApp()
    client_app.query()(functools.partial(_replying, _query, defaults=defaults))
    client_app.train()(functools.partial(_replying, _train, defaults=defaults))
    client_app.evaluate()(functools.partial(_replying, _evaluate, defaults=defaults))
    return client_app


app = make_client_app()
