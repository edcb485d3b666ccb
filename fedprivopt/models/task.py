"""The task protocol shared by the local trainer, the Flower ClientApp and the engines.

A *task* bundles a model architecture, the per-user training data and the held-out evaluation of
one learning problem. It has no Flower in it. Tasks are built from plain keyword parameters through
:func:`fedprivopt.models.build_task`, by a registered name or by a reference
``"package.module:factory"``, so every process (every Ray worker of a simulation, every SuperNode
of a deployment) can rebuild the same task cheaply; they are also picklable.

A class with the seven members of :class:`Task` runs on every engine and in a deployment; nothing
else is required. The optional members below only improve what a run reports or how fast the
fast engine trains, and each has a fallback:

``primary_metric`` (str)
    The metric reports lead with; without it, ``"accuracy"``.
``cohort_trainer(*, device, chunk_users)``
    The fast engine's vectorized trainer of a whole chunk of users (e.g.
    :class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer`); without it, or with
    ``vectorize = false``, the fast engine trains one user at a time with
    :class:`~fedprivopt.clients.LocalTrainer`, exactly as a ClientApp does.
``reference()``
    ``(name, metrics)`` of an untrained public reference model, written to ``summary.json``;
    without it, ``null``.
``initialization`` (str)
    How :meth:`Task.build_model` initializes, for ``summary.json``; without it, ``null``.
``data_identity()``
    A JSON-able mapping that identifies the data the task reads (file sizes, digests), recorded
    in the run's privacy ledger and compared when the run is resumed or reused, so that other
    data put at the same path is refused; without it, no such check. A task class defined
    outside this package, and a task by reference's factory, has the digest of its module's
    source recorded too (an edited task module is refused in the same way).
``private_evaluation_users()``
    ``(private, evaluated)``: how many of the users whose data :meth:`Task.evaluate` reads are
    training users (the private population), and how many users it reads; ``(0, 0)`` for an
    evaluation drawn apart from every user. ``fedprivopt tune`` selects on that evaluation, so it
    refuses a selection on private users (:func:`private_evaluation_users`); without it, the
    overlap is unknown and reported as not checked.
``word_count_path``, ``num_features``, ``num_tags``
    What AdaDPS' bag-of-words side-information kinds need; without them ``auto`` side
    information is ``ones`` (``public-users`` works on any task).

The model's state dict is handled as one flat vector (:func:`fedprivopt.privacy.flatten`): the
server broadcasts it, clients return flat updates of the same layout. :func:`model_spec` and
:func:`initial_flat` give that layout and the initial point.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import sys
from collections.abc import Iterator, Mapping
from numbers import Integral
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from fedprivopt.core.text import shown
from fedprivopt.privacy.flat import FlatSpec, flatten

__all__ = [
    "TASK_SOURCE",
    "Task",
    "TaskError",
    "built_model",
    "data_identity",
    "evaluating",
    "frozen_coordinates",
    "frozen_mask",
    "initial_flat",
    "model_device",
    "model_spec",
    "note_factory",
    "primary_metric",
    "private_evaluation_users",
    "refuse_inexact_entries",
    "refuse_tensorless_entries",
    "refuse_unbuilt_model",
    "state_to_flat",
]


class TaskError(TypeError, ValueError):
    """A task's optional member breaks the protocol (a wrong type or shape of what it returns).

    A ``TypeError`` for callers of the Python API, and a ``ValueError`` so that the command line
    says it in one line with exit 2, as it says a bad task parameter: twenty-third review of
    issue 15, where a task by reference whose ``data_identity()`` returned a list (or a set
    inside its mapping), whose ``primary_metric`` was ``5``, whose ``private_evaluation_users()``
    returned a list, or whose ``reference()`` returned a string ended in a traceback (rc 1), or in
    ``error: too many values to unpack (expected 2)`` after the run's last round.
    """


@runtime_checkable
class Task(Protocol):
    """A federated learning problem: model, per-user data and held-out evaluation.

    Attributes
    ----------
    name : str
        Short name of the task: its registry name (see :func:`fedprivopt.models.build_task`);
        for a task built by reference, any name (the run records the reference).
    num_users : int
        Number of training users; user ids are ``0 .. num_users - 1``.

    primary_metric : str, optional
        The metric of :meth:`evaluate` that reports lead with (e.g. ``"recall_at_5"``); a task
        without this attribute is reported by its ``"accuracy"`` (:func:`primary_metric`). Not
        part of the protocol's check; the other optional members are listed in the module's
        documentation.

    Notes
    -----
    Implementations must be deterministic: :meth:`build_model` initializes from the task's seed
    (never from the global RNG) and :meth:`user_data` returns the same tensors for the same user on
    every call and in every process.
    """

    name: str
    num_users: int

    def build_model(self) -> torch.nn.Module:
        """Return a freshly initialized model on the CPU (deterministic from the task's seed)."""
        ...

    def user_data(self, user_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(features, labels)`` of one user's training examples as CPU tensors.

        The first dimension indexes examples and may be zero.
        """
        ...

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return the mean loss of ``model`` over the batch ``(x, y)`` (a scalar tensor)."""
        ...

    def evaluate_data(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, float]:
        """Return mean metrics over the examples ``(x, y)``: at least ``"loss"``, ``"accuracy"``.

        Used for client-side evaluation on a user's own data; ``x`` and ``y`` are on the CPU and
        the model may be on any device.
        """
        ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Evaluate on the task's held-out data: at least ``"loss"`` and ``"accuracy"``."""
        ...


def primary_metric(task: Task) -> str:
    """The round-metric key of ``task``'s headline metric: ``"eval_" + task.primary_metric``.

    Progress lines, the command line's last line, run summaries and reports lead with it.
    ``"eval_accuracy"`` for a task that does not name one.
    """
    from fedprivopt.models.task_calls import task_attribute  # it imports this module

    name = task_attribute(task, "primary_metric", "accuracy")  # a property's own error named
    if not isinstance(name, str) or not name:
        raise TaskError(f"{type(task).__name__}.primary_metric must be a metric name, got {name!r}")
    return f"eval_{name}"


def private_evaluation_users(task: Task) -> tuple[int, int] | None:
    """``task.private_evaluation_users()`` checked; ``None`` for a task without it (unknown).

    Returns
    -------
    tuple of int or None
        ``(private, evaluated)``: the evaluation users who are also training users, and the
        evaluation users; ``None`` when the task does not say.

    Raises
    ------
    TaskError
        When the method returns anything but two integers ``0 <= private <= evaluated``.
    """
    from fedprivopt.models.task_calls import task_attribute  # it imports this module

    method = task_attribute(task, "private_evaluation_users")  # its own error named (outputs 4)
    if not callable(method):
        return None
    value = _called(task, "private_evaluation_users")
    ok = isinstance(value, tuple) and len(value) == 2
    ok = ok and all(isinstance(v, Integral) and not isinstance(v, bool) for v in value)
    if ok:
        # forty-fifth review of issue 15 (api 4): NumPy's counts (np.int64(0), np.int64(10)),
        # as a task computing them with NumPy returns, were refused as out of range; the
        # stored values (operator.index, not an int subclass' own comparisons) are checked
        value = (operator.index(value[0]), operator.index(value[1]))
    if not ok or not 0 <= value[0] <= value[1]:
        raise TaskError(
            f"{type(task).__name__}.private_evaluation_users() must return (private, evaluated) "
            f"with 0 <= private <= evaluated, got {value!r}"
        )
    return value


def _called(task: Task, member: str) -> object:
    """``task.member()``; its own exception or ``sys.exit()`` is a :class:`TaskError`."""
    from fedprivopt.models.task_calls import task_call  # it imports this module

    call = f"{type(task).__name__}.{member}()"
    with task_call(call, f"{call} must return"):
        return getattr(task, member)()


TASK_SOURCE = "task_source"
"""The key of :func:`data_identity` that holds the digest of a user's task module."""


def data_identity(task: Task) -> dict | None:
    """What identifies ``task``'s data and code, as a plain dict (once per task object).

    ``task.data_identity()`` (a mapping of JSON values), and for a task class defined outside
    this package (a task by reference) :data:`TASK_SOURCE`: its module's name and the SHA-256
    of its source file. A task module edited after its runs (say, its data seed) then makes
    ``--resume`` and ``compare``'s reuse refuse the run instead of continuing or reporting it
    on other data (twenty-third review of issue 15). ``None`` for a package task without the
    method.

    Raises :class:`TaskError` when the method returns something other than a mapping of JSON
    values (strings, numbers, booleans, ``None``, and lists and mappings of them).
    """
    cached = getattr(task, "__dict__", {}).get("_fedprivopt_data_identity")
    if cached is not None:
        return dict(cached)
    from fedprivopt.models.task_calls import task_attribute  # it imports this module

    method = task_attribute(task, "data_identity")  # its own error named (outputs 4)
    if method is not None and not callable(method):
        # forty-sixth review of issue 15 (flags 4): read as absent unless callable, so a task
        # of one's own that set it as an attribute (self.data_identity = {"data_sha256": ...}
        # of its data file, in __init__) recorded nothing of its data: after the file changed,
        # --resume and compare's reuse went on with the earlier rounds' run on other data
        raise TaskError(
            f"{type(task).__name__}.data_identity must be a method returning a mapping of JSON "
            f"values, got {type(method).__name__!r}"
        )
    source = _task_source(task)
    if not callable(method):
        return None if source is None else {TASK_SOURCE: source}
    value = _called(task, "data_identity")
    if not isinstance(value, Mapping):
        raise TaskError(
            f"{type(task).__name__}.data_identity() must return a mapping, got "
            f"{type(value).__name__!r}"
        )
    value = {str(k): v for k, v in value.items()}
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:  # a set, a tensor, a cycle
        raise TaskError(
            f"{type(task).__name__}.data_identity() must return a mapping of JSON values "
            f"(strings, numbers, booleans, None, lists and mappings of them): {exc}"
        ) from None
    if source is not None:
        value[TASK_SOURCE] = source
    with contextlib.suppress(AttributeError):  # a task with __slots__ is asked again next time
        task._fedprivopt_data_identity = value
    return dict(value)


def note_factory(
    task: object, module: str | tuple[str, ...], *, factory: str | None = None
) -> None:
    """Record on ``task`` the module(s) of the factory that built it, for :func:`data_identity`.

    :func:`~fedprivopt.models.registry.build_task` calls this for a task by reference; a task
    whose attributes cannot be set (``__slots__``, a frozen dataclass) keeps its class's module
    only. A tuple names several modules (a ``functools.partial`` of a function of one's own made
    in another module: the function's module and the one that made the partial). ``factory``:
    which factory a registered name stands for (``registry.factory_text``), recorded beside the
    digests (forty-seventh review, api 3).
    """
    value = tuple(str(m) for m in module) if isinstance(module, tuple) else str(module)
    with contextlib.suppress(AttributeError, TypeError):
        task._fedprivopt_factory_module = value  # type: ignore[attr-defined]
        if factory is not None:  # a registered name's factory (forty-seventh review, api 3)
            task._fedprivopt_factory_text = str(factory)  # type: ignore[attr-defined]


def _user_module(module: object) -> bool:
    return isinstance(module, str) and not (
        module == "fedprivopt" or module.startswith("fedprivopt.")
    )


def _task_source(task: Task) -> dict | None:
    """``{"module", "sha256"}`` of the source files of ``task``'s class and factory, not ours.

    Thirty-sixth review of issue 15 (tasks, finding 4): only the class's module was digested,
    so a factory of one's own setting a packaged task's data (``def make(**p): return
    ToyClassificationTask(seed=3, ...)``), or a factory in another module than its class, was
    edited (seed 3 to 4) and ``simulate --resume`` went on with rc 0, rounds 3-4 on other data
    and another test set than rounds 1-2. Two modules are one entry: their names joined with
    ``and``, the SHA-256 of their digests (one module keeps the entry it had).
    """
    modules = [type(task).__module__]
    factory = getattr(task, "__dict__", {}).get("_fedprivopt_factory_module")
    for module in factory if isinstance(factory, tuple) else (factory,):
        if module not in modules:
            modules.append(module)
    digests = []
    for module in filter(_user_module, modules):
        loaded = sys.modules.get(module)
        path = getattr(loaded, "__file__", None)
        if not path:
            continue
        digests.append((module, hashlib.sha256(_source_bytes(loaded, path)).hexdigest()))
    if not digests:
        return None
    # which factory a registered name stands for: its module's digest alone is the same for
    # another factory of that module, or another partial made there (forty-seventh review, api 3)
    text = getattr(task, "__dict__", {}).get("_fedprivopt_factory_text")
    named = {} if text is None else {"factory": text}
    if len(digests) == 1:
        return {"module": digests[0][0], "sha256": digests[0][1], **named}
    joined = "\n".join(digest for _, digest in digests).encode()
    return {
        "module": " and ".join(module for module, _ in digests),
        "sha256": hashlib.sha256(joined).hexdigest(),
        **named,
    }


def _source_bytes(module: object, path: str) -> bytes:
    """The bytes of ``module``'s source file ``path``, read by its loader if need be.

    Forty-seventh review of issue 15 (sameness 1): a task module imported from a zip archive
    (``PYTHONPATH=tasks.zip``; ``__file__`` is ``tasks.zip/mod.py``, no file of the file system)
    could not be read, and a file that could not be read was skipped: the run recorded no digest
    of its code, so after the module was edited (its data seed 3 to 4) ``simulate --resume``
    went on with rc 0, its later rounds on other data. The loader reads it (``get_data``, as
    ``zipimport`` does); a source neither can read is refused naming it (``TaskError``).
    """
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        error: Exception = exc
    get_data = getattr(getattr(module, "__loader__", None), "get_data", None)
    if callable(get_data):
        try:
            data = get_data(path)
        except (OSError, ImportError, ValueError) as exc:
            error = exc
        else:
            if isinstance(data, bytes):
                return data
    raise TaskError(
        f"the source of task module {getattr(module, '__name__', '?')!s} ({path}) cannot be "
        f"read ({type(error).__name__}: {error}); fedprivopt records its digest so that a "
        "resume or a reused run on edited code is refused"
    )


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.device]:
    """Run a block with ``model`` in eval mode and without gradients; yield its device.

    The model's training flag is restored afterwards, also when the block raises.
    """
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield device
    finally:
        model.train(was_training)


def built_model(task: Task) -> object:
    """``task.build_model()``; its own exception or ``sys.exit()`` is a :class:`TaskError`.

    Forty-seventh review of issue 15 (api 4): every call of it is checked so (the run's first
    is ``run_checks.initial_model``'s); one that raised at a later call (a weights file moved
    away after the start) ended in a traceback, rc 1, from :func:`model_spec`,
    :func:`frozen_mask`, :func:`initial_flat`, the trainer or AdaDPS' public users.
    """
    from fedprivopt.models.task_calls import task_call  # it imports this module

    name = f"{type(task).__name__}.build_model()"
    with task_call(name, f"{name} must return"):
        return task.build_model()


def model_spec(task: Task) -> FlatSpec:
    """Return the flat layout (:class:`~fedprivopt.privacy.FlatSpec`) of ``task``'s model."""
    model = built_model(task)
    refuse_unbuilt_model(model, task)  # forty-sixth review of issue 15 (api 3)
    state = model.state_dict()
    spec = flatten(state)[1]
    refuse_inexact_entries(state, spec.dtype, task)
    return spec


def refuse_tensorless_entries(state: Mapping[str, object], task: object) -> None:
    """Raise :class:`TaskError` for an entry of a model's state dict that is not a tensor.

    Forty-fourth review of issue 15 (api 4): a task whose model has a module with
    ``get_extra_state()`` returning a dict (torch's way to save a module's settings, a version
    number) ended :class:`~fedprivopt.clients.LocalTrainer` (a ClientApp's trainer) in
    ``AttributeError: 'dict' object has no attribute 'detach'`` and :func:`initial_flat` in a
    line naming ``state['0._extra_state']`` but not the task: the model travels as one flat
    vector of its state dict's tensors, so such an entry is refused naming it.
    """
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TaskError(
                f"the model of {type(task).__name__}.build_model() has state dict entry {name!r} "
                f"holding a {type(value).__name__}, not a tensor (a module's get_extra_state()): "
                "the model is trained and sent as one flat vector of its tensors; keep such "
                "state in a buffer (register_buffer), or return a tensor from get_extra_state()"
            )


def refuse_unbuilt_model(model: object, task: object, *, cpu_only: bool = False) -> None:
    """Raise :class:`TaskError` unless ``model`` is a module of initialized tensors with data.

    With ``cpu_only``, a tensor on any device but the CPU is refused too (a task's
    ``build_model()`` as a command reads it, ``simulation.run_checks.initial_model``).

    Forty-sixth review of issue 15 (api 3): a lazy module (``LazyLinear``) or a model on the
    ``meta`` device ended :class:`~fedprivopt.clients.LocalTrainer`, :func:`initial_flat` and
    :func:`model_spec` in torch's errors naming neither the task nor the entry; a command
    refuses it in this line (``simulation.run_checks.initial_model``).
    """
    name = f"{type(task).__name__}.build_model()"
    if not isinstance(model, torch.nn.Module):
        raise TaskError(f"{name} must return a torch.nn.Module, got {type(model).__name__}")
    state = model.state_dict(keep_vars=True)
    refuse_tensorless_entries(state, task)
    for key, tensor in state.items():
        if isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
            what = "uninitialized (a lazy module: give its sizes, or run it once in build_model)"
        elif tensor.device.type == "meta" or (cpu_only and tensor.device.type != "cpu"):
            what = f"on device {tensor.device} (build the model on the CPU)"
        else:
            continue
        raise TaskError(f"{name} must return a model of tensors on the CPU; {key!r} is {what}")


def refuse_inexact_entries(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype, task: object
) -> None:
    """Raise :class:`TaskError` for an integer entry of ``state`` that ``dtype`` cannot hold.

    Forty-first review of issue 15 (api 3): the flat vector is float32 for a float32 model, so
    an ``int64`` buffer or frozen parameter (a hashing seed, a vocabulary's id offset) beyond
    2^24 came back rounded from it: a buffer ``2**40 + 1`` was ``2**40`` in every user's model and
    in the evaluated one (rc 0), where buffers keep their ``build_model()`` values
    (docs/TASKS.md). Such an entry is refused naming it.
    """
    for name, value in state.items():
        value = value.detach()
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            continue
        back = value.to(dtype).to(value.dtype)
        wrong = (back != value).reshape(-1).nonzero()
        if wrong.numel():
            i = int(wrong[0, 0])
            held, rounded = int(value.reshape(-1)[i]), int(back.reshape(-1)[i])
            raise TaskError(
                f"the model of {type(task).__name__}.build_model() has {value.dtype} entry "
                f"{name!r} holding {held}, which the model's flat dtype {dtype} cannot hold "
                f"exactly (it would be {rounded}): keep integer "
                "buffers within that dtype's exact integers, or make the model float64"
            )


def frozen_mask(task: Task) -> torch.Tensor | None:
    """The coordinates of the flat layout that no client trains, or ``None``.

    A parameter whose ``requires_grad`` is off in :meth:`Task.build_model` (e.g.
    ``stackoverflow-tp``'s bias with ``train-bias = false``), and every buffer (a registered
    constant, batch-norm statistics, a counter), is never changed by a client
    (:class:`~fedprivopt.clients.LocalTrainer` trains only the trainable parameters), so its
    coordinates of every clipped update are zero. The server algorithms set these coordinates of
    the noised mean to zero before any optimizer sees it: the noise drawn there is dropped, and
    the parameter or buffer keeps its initial value. Zeroing coordinates that are the same for
    every dataset is post-processing of the release; it costs no privacy.

    Thirty-fourth review of issue 15 (tasks, finding 2): buffers were left out of the mask, so
    the server's noise and optimizer steps moved them every round: a task's normalization
    constant of 3.0 (a buffer its forward divides by) was 6.02, 2.43, 3.76 and 2.68 after two
    rounds at ``noise-multiplier = 5``, a model no client had trained.

    Returns
    -------
    torch.Tensor or None
        Boolean vector of the flat length (True: not trained), or ``None`` when every entry of
        the state dict is a trainable parameter.
    """
    return frozen_coordinates(built_model(task))


def frozen_coordinates(model: torch.nn.Module) -> torch.Tensor | None:
    """:func:`frozen_mask` of a model already built (the mask of its flat layout, or ``None``)."""
    live = model.state_dict(keep_vars=True)
    parts = [
        torch.full(
            (value.numel(),),
            not (isinstance(value, torch.nn.Parameter) and value.requires_grad),
            dtype=torch.bool,
        )
        for value in live.values()
    ]
    mask = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)
    return mask if bool(mask.any()) else None


def initial_flat(task: Task) -> torch.Tensor:
    """Return the initial model of ``task`` as one flat CPU vector (layout :func:`model_spec`)."""
    model = built_model(task)
    refuse_unbuilt_model(model, task)  # forty-sixth review of issue 15 (api 3)
    state = model.state_dict()
    flat, spec = flatten(state)
    refuse_inexact_entries(state, spec.dtype, task)
    return flat


def state_to_flat(state: Mapping[str, torch.Tensor], spec: FlatSpec) -> torch.Tensor:
    """Flatten a state dict in the order of ``spec`` and check it matches the layout.

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        A state dict with (at least) the keys of ``spec``, in any order; e.g. a received
        ``ArrayRecord`` converted with ``to_torch_state_dict()``.
    spec : FlatSpec
        The expected layout.

    Returns
    -------
    torch.Tensor
        Flat vector of dtype ``spec.dtype`` on the device of the first entry.

    Raises
    ------
    ValueError
        If a key is missing or extra, or a shape differs from ``spec``.
    """
    names = set(spec.names)
    missing = [n for n in spec.names if n not in state]
    extra = [k for k in state if k not in names]
    if missing or extra:
        raise ValueError(
            f"state does not match the model layout: missing keys {_some_keys(missing)}, "
            f"unexpected keys {_some_keys(extra)}"
        )
    for name, shape in zip(spec.names, spec.shapes, strict=True):
        if tuple(state[name].shape) != shape:
            raise ValueError(
                f"state[{name!r}] has shape {tuple(state[name].shape)}, the model expects {shape}"
            )
    flat, _ = flatten({n: state[n] for n in spec.names})
    return flat.to(spec.dtype)


def _some_keys(keys: list[object], most: int = 3) -> str:
    """``keys`` for a message: the first ``most``, each cut as :func:`shown` cuts it, and a count.

    Follow-up of the forty-fourth review of issue 15 (privacy 2): :func:`state_to_flat` wrote
    every key whole, so a message whose model held 20,000 extra arrays (a hostile or broken
    server) gave a 288,962-character error on the node, in its log and in its reply (cut there to
    its last 80 characters, which named neither the missing keys nor the count). A short list
    reads as before (``['_orig_mod.weight', '_orig_mod.bias']``).
    """
    listed = ", ".join(shown(key) for key in keys[:most])
    if len(keys) <= most:
        return f"[{listed}]"
    return f"[{listed}, …] ({len(keys):,} in all)"
