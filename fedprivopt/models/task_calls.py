"""The two calls of a task every trainer makes, with what they return checked.

:func:`user_examples` calls ``task.user_data(user)`` and :func:`minibatch_loss` calls
``task.loss(model, x, y)``; each raises :class:`~fedprivopt.models.task.TaskError` (one line with
exit 2 from the command line) when the result breaks the protocol of ``docs/TASKS.md``, before it
reaches the trainer's indexing or autograd.

Thirty-second review of issue 15 (models, findings 1 and 2): a task by reference whose
``user_data`` returned ``x`` and ``y`` of different lengths, numpy arrays, ``None`` or a scalar
``x`` ended in an ``IndexError``, ``AttributeError`` or ``TypeError`` traceback from the trainer
(rc 1), and one whose ``loss`` returned a per-example vector, a Python float, ``None`` or a
detached tensor ended in autograd's ``RuntimeError``/``TypeError`` traceback, naming neither the
task nor the member. :func:`without_exit` turns a member's ``sys.exit()`` into such an error.

Thirty-fifth review of issue 15 (lead, the thirty-fourth review's open engines item): a task whose
``user_data`` raised its own exception for one user (``OSError("damaged file for user 3")``)
ended the fast engine in a 40-line traceback (rc 1), while the Flower engine counted the user
``failed`` in every round and ended rc 0 with a model trained without them: two models from one
configuration. :func:`user_examples` and :func:`minibatch_loss` now turn such an exception into a
:class:`TaskError` naming the member, the user, the exception and where it was raised
(:func:`raised`): the fast engine ends with that one line (exit 2) before the round is released,
and a ClientApp answers it with a ``TASK_ERROR`` reply, on which the simulation's strategy stops
the same way. Running out of memory is not the task's error and stays as it was.

Thirty-seventh review of issue 15 (cli, finding 3; the environment reviewer's report): torch's
CPU allocator reports a failed allocation (``ulimit -v``, a machine without the memory) as a
``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory"), not a ``MemoryError``: a task
member's such failure was blamed on the task, and one anywhere else ended in a traceback (rc 1).
:func:`out_of_memory` tells every such failure, for this module and the command line.

Forty-sixth review of issue 15 (wire, open; the follow-up's privacy 1): a ClientApp sent the
error's whole text to the server as its error reply's reason: ``user_data(4)`` returning one
label fewer than examples sent user 4's example count (``a tensor of shape (7, 5)``), a
``KeyError`` of a token of the user's data sent the token (``'alice@example.com'``), outside
epsilon. Each error of this module now carries what a node may send of it (:func:`sent_reason`):
the task, the member and the exception's type, or what fedprivopt's check expected, never what
it found; the node logs the whole text, the in-process engines raise it whole as before.
"""

from __future__ import annotations

import contextlib
import sysconfig
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fedprivopt.core.text import shown
from fedprivopt.models.task import TaskError

__all__ = [
    "NODE_LOG",
    "exited",
    "minibatch_loss",
    "out_of_memory",
    "raised",
    "sent_as",
    "sent_reason",
    "task_attribute",
    "task_call",
    "user_examples",
    "without_exit",
]

_NOT_USERS_CODE = tuple(
    {Path(__file__).resolve().parents[1]}
    | {
        Path(sysconfig.get_path(k)).resolve()
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)
"""``fedprivopt`` and the installed libraries: frames there are not where a task's code raised."""

_NOT_THE_TASKS = (MemoryError, torch.OutOfMemoryError, TaskError)
"""Exceptions a member's call passes on as they are: memory is the machine's, not the task's."""

_ALLOCATOR_FAILED = "can't allocate memory"
"""What torch's CPU allocator's ``RuntimeError`` says when the memory it asked for was refused."""

_SENT = "_fedprivopt_sent_reason"
"""The attribute of a :class:`TaskError` that holds what a node may send of it (:func:`sent_as`)."""

NODE_LOG = "the full message is in the node's log"
"""Where an error reply's reason sends its reader: the node logs the error whole."""


def sent_as(error: TaskError, reason: str) -> TaskError:
    """``error``, whose error reply (:func:`sent_reason`) says ``reason`` instead of its text.

    ``reason`` must hold nothing computed from a user's data: the task, the member, the
    exception's type, what was expected. The error's own text (raised in process, logged by a
    node) is unchanged.
    """
    setattr(error, _SENT, reason)
    return error


def sent_reason(error: TaskError) -> str:
    """What a node sends of ``error`` to the server: nothing computed from a user's data.

    The reason :func:`sent_as` gave it (or, for another :class:`TaskError`, only that the node's
    task broke its protocol), followed by :data:`NODE_LOG`. The error's own text may hold a
    user's values (the task's exception text, a tensor's shape: the user's example count), which
    reach the server outside the privacy guarantee.
    """
    reason = getattr(error, _SENT, None)
    if not isinstance(reason, str):
        reason = f"the node's task broke its protocol ({type(error).__name__})"
    return f"{reason}; {NODE_LOG}"


def _member(call: str) -> str:
    """The member of a call as :func:`task_call` names it: ``MyTask.user_data`` of ``...(3)``."""
    return call.partition("(")[0]


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says this machine (or process limit) ran out of memory.

    A ``MemoryError``, torch's ``OutOfMemoryError`` (a device's memory), or the ``RuntimeError``
    of torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory: you tried to allocate
    960000000 bytes"), which torch raises where Python would raise ``MemoryError``.
    """
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return type(exc) is RuntimeError and _ALLOCATOR_FAILED in str(exc)


def exited(exc: SystemExit) -> str:
    """How a user's code ended the process, for a message: ``it called sys.exit(2)``.

    Thirty-fourth review of issue 15 (tasks, finding 3): a task module, factory or member that
    calls ``sys.exit()`` (a training script's ``parser.parse_args()`` at import, an ``exit()``
    left at its end) raises ``SystemExit``, which no handler of the command line takes for an
    error: ``simulate`` ended with the task's code (0: a success with nothing run) and no line.
    """
    return f"it called sys.exit({shown(exc.code) if exc.code is not None else ''})"


def raised(exc: BaseException) -> str:
    """How a user's code failed, for a message: ``OSError at my_task.py:12: damaged file``.

    The place is the innermost frame of the traceback outside ``fedprivopt`` and the installed
    libraries (the task's own code, not torch's line that raised for it), left out when there is
    none (a built-in task's error says what it is about).
    """
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        with contextlib.suppress(OSError, ValueError):
            path = Path(frame.filename).resolve()
            if not any(path.is_relative_to(d) for d in _NOT_USERS_CODE):
                where = f" at {Path(frame.filename).name}:{frame.lineno}"
                break
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(exc).__name__}{where}" + (f": {text}" if text else "")


@contextlib.contextmanager
def task_call(call: str, rule: str) -> Iterator[None]:
    """Run ``call`` (``MyTask.user_data(3)``): its exception or ``sys.exit()`` is a TaskError.

    ``rule`` is what the member must do, for the ``sys.exit()`` message (:func:`without_exit`).
    The error reads ``MyTask.user_data(3) raised OSError at my_task.py:6: damaged file``
    (:func:`raised`); memory errors and TaskErrors pass as they are. Every call of a task's
    member may go through this (thirty-sixth review of issue 15, tasks, finding 6:
    ``data_identity()`` and ``private_evaluation_users()`` raising their own exception, a data
    file gone, ended in a traceback, rc 1).
    """
    try:
        with without_exit(rule):
            yield
    except _NOT_THE_TASKS:
        raise
    except Exception as exc:
        if out_of_memory(exc):
            raise
        error = TaskError(f"{call} raised {raised(exc)}")
        raise sent_as(error, f"{_member(call)} raised {type(exc).__name__}") from exc


def task_attribute(task: object, name: str, default: Any = None) -> Any:
    """``getattr(task, name, default)``, a property's own exception a :class:`TaskError`.

    For a task's optional members (``primary_metric``, ``initialization``, ``name``,
    ``word_count_path``...): a property that raises ``AttributeError`` reads as absent, as
    before; any other exception (or ``sys.exit()``) names the member, the exception and where
    it was raised. Forty-seventh review of issue 15 (follow-up outputs 4; the api reviewer's
    open row): such a property reading a file that was gone (``OSError``) ended ``simulate`` in
    a traceback, rc 1, where docs/TASKS.md gives one line naming the member, rc 2.
    """
    member = f"{type(task).__name__}.{name}"
    with task_call(member, f"{member} must give its value"):
        return getattr(task, name, default)


@contextlib.contextmanager
def without_exit(rule: str) -> Iterator[None]:
    """Run a call of a task's member, whose ``sys.exit()`` becomes a :class:`TaskError`.

    ``rule`` says what the member must do (``MyTask.evaluate() must return``); the error is
    ``"{rule}; it called sys.exit(0)"``. Thirty-fourth review of issue 15 (tasks, finding 3,
    and the tasks reviewer's report): ``sys.exit()`` in ``user_data``, ``loss``,
    ``build_model()`` or ``evaluate()`` ended ``simulate`` with the task's exit code (0: a run
    half done passing for a success) and no line.
    """
    try:
        yield
    except SystemExit as exc:
        error = TaskError(f"{rule}; {exited(exc)}")
        raise sent_as(error, f"{_member(rule)} called sys.exit()") from None


def _described(value: object) -> str:
    """What ``value`` is, for a message: a tensor's dtype and shape, else its type."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return f"a nested {value.dtype} tensor"
        what = f"a {value.dtype} tensor of shape {shown(tuple(value.shape))}"
        if value.layout != torch.strided:
            what += f" of layout {value.layout}"
        return what + (f" on device {value.device}" if value.device.type == "meta" else "")
    if isinstance(value, (tuple, list)):
        items = ", ".join(_described(v) for v in value[:3])
        more = ", ..." if len(value) > 3 else ""
        return f"a {type(value).__name__} of {len(value)} ({items}{more})"
    return f"{type(value).__name__!r}"


def user_examples(task: object, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``task.user_data(user_id)``: two tensors ``(x, y)`` with the same number of rows.

    Raises
    ------
    TaskError
        When the result is not a pair of dense tensors (strided, not on the ``meta`` device) of
        at least one dimension whose first dimensions (the user's examples) agree.
    """
    call = f"{type(task).__name__}.user_data({user_id})"
    with task_call(call, f"{call} must return (x, y)"):
        value = task.user_data(user_id)  # type: ignore[attr-defined]
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    ok = ok and all(isinstance(v, torch.Tensor) and _dense(v) and v.dim() >= 1 for v in value)
    if not ok or value[0].shape[0] != value[1].shape[0]:
        rule = (
            "must return (x, y): two tensors with one row per example, as many in y as in x "
            "(dense: not sparse, nested or on the meta device)"
        )
        error = TaskError(f"{call} {rule}; got {_described(value)}")
        raise sent_as(error, f"{_member(call)} {rule}")
    return value[0], value[1]


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds its values as a trainer indexes them: strided, with data.

    Thirty-sixth review of issue 15 (tasks, finding 2): a sparse ``x`` (a bag-of-words as
    ``to_sparse()``), a nested one or one on the ``meta`` device passed the check of
    :func:`user_examples` and ended in a 50-140-line traceback from the trainer's indexing
    (``Could not run 'aten::index.Tensor' with arguments from the 'SparseCPU' backend``,
    ``Cannot copy out of meta tensor``, ``NestedTensorImpl doesn't support sizes``), rc 1.
    """
    return not tensor.is_nested and tensor.layout == torch.strided and tensor.device.type != "meta"


def minibatch_loss(
    task: object, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """``task.loss(model, x, y)``: a floating-point tensor of one value with a gradient.

    Raises
    ------
    TaskError
        When the result is not such a tensor (a per-example vector, a Python number, an integer
        tensor, one detached from the model's parameters or a leaf made with
        ``requires_grad=True``), or the call set the gradients of
        the model's parameters (``loss.backward()`` inside ``loss``). The parameters' ``grad``
        is ``None`` after a call that returns.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # a gradient there after the call comes from the task's own backward()
        p.grad = None
    name = type(task).__name__
    with task_call(f"{name}.loss()", f"{name}.loss() must return the mean loss of the minibatch"):
        loss = task.loss(model, x, y)  # type: ignore[attr-defined]
    if any(p.grad is not None for p in params):
        # thirty-fourth review of issue 15 (tasks, finding 4): autograd's "Trying to backward
        # through the graph a second time" traceback at the trainer's gradient, or (with
        # retain_graph) AdaDPS' public-users gradients counted twice
        text = (
            f"{type(task).__name__}.loss() must return the mean loss of the minibatch without "
            "calling backward() on it (the trainer takes the gradient); it set the gradients "
            "of the model's parameters"
        )
        raise sent_as(TaskError(text), text)  # nothing of the user's data
    ok = isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()
    # thirty-sixth review of issue 15 (tasks, finding 3): a loss made a tensor of its own
    # (``torch.tensor(value, requires_grad=True)``) passed, and every update was zero
    made = ok and loss.grad_fn is None and not any(loss is p for p in params)
    if not ok or not loss.requires_grad or made:
        what = _described(loss)
        if ok and not loss.requires_grad:
            what += " that does not require grad (not computed from the model parameters)"
        elif ok:
            what += " made with requires_grad (a leaf: no gradient of it reaches the model)"
        rule = (
            f"{type(task).__name__}.loss() must return the mean loss of the minibatch, a "
            "floating-point tensor of one value computed from the model"
        )
        raise sent_as(TaskError(f"{rule}; got {what}"), rule)  # a shape: the batch's examples
    return loss
