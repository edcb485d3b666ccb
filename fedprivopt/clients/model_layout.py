"""The local trainer's model on the flat layout, and its own state set back before every user.

:class:`ModelLayout` is a mixin of :class:`~fedprivopt.clients.trainer.LocalTrainer`: it lays the
model's state dict out on the flat vector (which entries are trainable parameters, refused when
tied, of another dtype or absent), loads a flat vector into the model (trainable parameters as
views of it, frozen ones and buffers copied) and gives the model to the caller
(:meth:`~ModelLayout.load_global`). It reads the trainer's attributes (``task``, ``model``,
``spec``, ``device``, ``_entries``, ``_at_build``).

:class:`ModelAtBuild` is what a model's forward may keep between calls, set back to its state of
``build_model()`` before every user (and before every evaluation of a run), so that nothing of
one user's data reaches the next one's update. :mod:`fedprivopt.clients.trainer` re-exports it.
"""

from __future__ import annotations

import array
import collections
import random
import types
from typing import NamedTuple

import numpy as np
import torch

from fedprivopt.models.task import TaskError
from fedprivopt.models.task_calls import sent_as
from fedprivopt.privacy.sparse import dense_problem

__all__ = ["ModelAtBuild", "ModelLayout"]


class _Entry(NamedTuple):
    name: str
    start: int
    stop: int
    shape: tuple[int, ...]
    tensor: torch.Tensor  # the model's parameter or buffer object
    trainable: bool


_CONTAINERS = (list, dict, set, collections.deque)
"""Attribute values whose contents are set back in place (``Module._parameters``, hook tables).

Their subclasses too (``OrderedDict``, ``defaultdict``: fortieth review of issue 15,
mechanisms 5, as ``collections.deque``; only the exact types were before).
"""

_TORCH_TABLES = frozenset({"_parameters", "_buffers", "_modules"})
"""A module's own tables of parameters, buffers and submodules (restored as tables above)."""

_DEPTH = 3
"""How deep :meth:`ModelAtBuild._save_inner` looks into containers of attribute values."""


class ModelAtBuild:
    """A model's own state as :meth:`Task.build_model` returned it, set back before every user.

    The state dict is loaded from the global model (:meth:`LocalTrainer._load`); the rest of a
    module is what its forward may keep between calls: buffers outside the state dict
    (``persistent=False``), and the attributes of every module (a buffer, parameter or
    submodule registered by the forward, a plain tensor attribute such as a running mean, a
    list it appends to, a counter). :meth:`restore` gives every module its attributes of the
    build back (the same objects; a list, dict or set with its contents of then; a tensor that
    is no parameter with its values of then), and removes what the forward added.

    Thirty-sixth review of issue 15 (tasks, finding 1): a forward that registered a buffer of
    its first minibatch's mean (``register_buffer`` in ``forward``, persistent or not), kept one
    in a plain attribute, registered a ``Parameter`` lazily or appended to a list carried user
    0's data into every later user's update on the same trainer: user 3's update after users
    0-2 differed from user 3's alone by 0.025 in an entry (the sum's sensitivity to one user
    above ``C``); only buffers registered in ``build_model()`` with ``persistent=False`` were
    reset (thirty-fourth review, finding 6).
    """

    def __init__(self, model: torch.nn.Module, *, saved: set[str]) -> None:
        self._start()
        # requires_grad as built: what the trainer trains (a loss may switch it, finding 5)
        self._grad_flags = [(p, p.requires_grad) for p in model.parameters()]
        names = {id(m): name for name, m in model.named_modules()}
        for module in model.modules():
            attrs = dict(vars(module))
            contents = {k: _contents(v) for k, v in attrs.items() if isinstance(v, _CONTAINERS)}
            self._modules.append((module, attrs, contents))
            prefix = names[id(module)] + "." if names[id(module)] else ""
            for key, value in module._buffers.items():
                if value is not None and prefix + key not in saved:  # persistent=False
                    self._tensors.append([module._buffers, key, value.detach().clone(), -1])
            for key, value in attrs.items():
                if isinstance(value, torch.Tensor) and not value.requires_grad:
                    self._tensors.append([vars(module), key, value.detach().clone(), -1])
                elif not isinstance(value, torch.nn.Module) and key not in _TORCH_TABLES:
                    self._save_inner(value, 0)

    def _start(self) -> None:
        """Empty records, filled by :meth:`__init__` or :meth:`of_attributes`."""
        self._modules: list[tuple[object, dict, dict]] = []
        self._grad_flags: list[tuple[torch.Tensor, bool]] = []
        # (table, key, initial values, version counter when they were last set)
        self._tensors: list[list] = []
        # what attribute values hold (fortieth review): tensors in containers (tensor, initial
        # values, version), NumPy arrays and bytearrays (object, initial values), and the
        # attribute tables of namespaces (table, initial entries)
        self._inner_tensors: list[list] = []
        self._arrays: list[tuple] = []
        self._tables: list[tuple[dict, dict]] = []
        self._generators: list[tuple[torch.Generator, torch.Tensor]] = []
        # NumPy's and Python's random generators: (object, state), set back by _set_random
        self._random: list[tuple[object, object]] = []

    @classmethod
    def of_attributes(cls, owner: object, *, skip: frozenset[str]) -> ModelAtBuild:
        """``owner``'s own attributes as they are now (those in ``skip`` kept as objects only).

        Its :meth:`restore` gives ``owner`` those objects back, removes what was added, and
        sets the values of its tensors (a copy of each is taken now), NumPy arrays, containers,
        namespaces and random generators back, as for a module. Follow-up of the forty-seventh
        review of issue 15 (privacy 2; egress 6): a :class:`~fedprivopt.clients.LocalTrainer`
        subclass whose ``precondition`` kept an Adagrad-like accumulator on the trainer
        (``self.acc = ... + grad * grad``) carried users 0-2's gradients into user 3's update
        (0.254 apart in an entry from user 3 trained alone, norm 0.783): the trainer set back
        its model before every user, not its own attributes.
        """
        self = cls.__new__(cls)
        self._start()
        attrs = dict(vars(owner))
        mine = {k: v for k, v in attrs.items() if k not in skip}
        # the modules of the skipped attributes (the trainer's model: set back by its own
        # ModelAtBuild), also under another name (self.net = self.model)
        own = {
            id(m)
            for k, v in attrs.items()
            if k in skip and isinstance(v, torch.nn.Module)
            for m in v.modules()
        }
        contents = {k: _contents(v) for k, v in mine.items() if isinstance(v, _CONTAINERS)}
        self._modules.append((owner, attrs, contents))
        for key, value in mine.items():
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                if value.device.type != "meta":
                    kept = value.detach().clone()
                    # always copied back (-1): a write through .data or NumPy is not counted
                    # by the version (forty-eighth review of issue 15, privacy 4)
                    self._tensors.append([vars(owner), key, kept, -1])
            elif isinstance(value, torch.nn.Module):
                if not any(id(m) in own for m in value.modules()):  # not the trainer's model
                    self._save_module(value)
            else:
                self._save_inner(value, 0)
        return self

    def _save_module(self, module: torch.nn.Module) -> None:
        """Record a module attribute whole: its parameters' and buffers' values too.

        Forty-eighth review of issue 15 (privacy 2; follow-up privacy 2's twin): a
        :class:`~fedprivopt.clients.LocalTrainer` subclass whose ``precondition`` is a module of
        its own (an Adagrad-like ``torch.nn.Module`` accumulating ``grad * grad`` in a buffer, or
        a ``BatchNorm1d`` of the gradients) kept it on the trainer, and its buffers carried users
        0-2's gradients into user 3's update (0.137 apart in an entry, norm 0.261 of 0.401):
        only the trainer's own tensors, arrays and containers were set back.
        """
        inner = ModelAtBuild(module, saved=set())  # every buffer (no state dict is loaded)
        for name in (
            "_modules", "_grad_flags", "_tensors", "_inner_tensors", "_arrays", "_tables",
            "_generators", "_random",
        ):  # fmt: skip
            getattr(self, name).extend(getattr(inner, name))
        for param in module.parameters():
            # always copied back (-1): a write through .data is not counted by its version
            self._inner_tensors.append([param, param.detach().clone(), -1])

    def _save_inner(self, value: object, depth: int) -> None:
        """Record what an attribute value holds that a forward may change in place.

        Fortieth review of issue 15 (mechanisms 4): a NumPy array (``self.stats += ...``), a
        ``bytearray``, a tensor inside a tuple, list or dict (``self.stats[0].add_(...)``) and
        the attributes of a ``types.SimpleNamespace`` kept user 0's data for the next users on
        the same trainer (user 3's update after users 0-2 differed from its own by 0.59 in an
        entry). Their values (and a namespace's attributes) are set back now, and so is the
        state of a ``torch.Generator`` attribute (mechanisms 5: its draws count the batches, so
        the examples, of earlier users); other objects' inner state is the task's to keep out
        of its forward (documented limit).
        """
        if isinstance(value, torch.nn.Parameter) or depth > _DEPTH:
            return
        if isinstance(value, torch.Tensor):
            if depth > 0 and not value.requires_grad and value.layout == torch.strided:
                # -1: always copied back, as above (privacy 4: self.box[0].data.add_(...))
                self._inner_tensors.append([value, value.detach().clone(), -1])
        elif isinstance(value, np.ndarray):
            if value.flags.writeable:
                self._arrays.append((value, value.copy()))
        elif isinstance(value, bytearray):
            self._arrays.append((value, bytes(value)))
        elif isinstance(value, array.array):  # follow-up of the fortieth review (privacy 6)
            self._arrays.append((value, array.array(value.typecode, value)))
        elif isinstance(value, torch.Generator):  # its draws so far count earlier users' batches
            self._generators.append((value, value.get_state()))
        elif isinstance(value, _RANDOM):  # follow-up of the fortieth review (privacy 5)
            self._random.append((value, _random_state(value)))
        elif isinstance(value, types.SimpleNamespace):
            table = vars(value)
            self._tables.append((table, dict(table)))
            for item in table.values():
                self._save_inner(item, depth + 1)
        elif isinstance(value, (tuple, list, collections.deque)):
            for item in value:
                self._save_inner(item, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                self._save_inner(item, depth + 1)

    def restore(self) -> None:
        """Set every module's attributes, and their tensors' values, back to the build's."""
        for module, attrs, contents in self._modules:
            table = vars(module)
            for key in [k for k in table if k not in attrs]:
                del table[key]
            table.update(attrs)
            for key, saved in contents.items():
                value = attrs[key]
                if isinstance(value, list):
                    value[:] = saved
                elif isinstance(value, collections.deque):
                    value.clear()
                    value.extend(saved)
                else:
                    value.clear()
                    value.update(saved)
        for param, flag in self._grad_flags:
            if param.requires_grad != flag:
                param.requires_grad_(flag)
        for entry in self._tensors:
            table, key, initial, _ = entry
            current = table[key]
            # always copied back (forty-eighth review of issue 15, privacy 5): a forward's write
            # through .data or NumPy (self.running.data.add_(...)) does not move the version, so
            # a tensor read as unwritten since the last user kept that user's data
            same = current.dtype == initial.dtype and current.shape == initial.shape
            if same and current.device == initial.device and current.layout == torch.strided:
                with torch.no_grad():
                    current.copy_(initial)  # in place: no allocation for a large cache
            else:  # resized or re-laid-out in place by the forward
                current = table[key] = initial.clone()
        for table, saved in self._tables:
            table.clear()
            table.update(saved)
        for generator, state in self._generators:
            generator.set_state(state)
        for generator, state in self._random:
            _set_random(generator, state)
        for kept, saved in self._arrays:
            if isinstance(kept, (bytearray, _PY_ARRAY)):
                kept[:] = saved
            else:
                if kept.shape != saved.shape:  # resized in place by the forward
                    kept.resize(saved.shape, refcheck=False)
                np.copyto(kept, saved)
        for entry in self._inner_tensors:
            tensor, initial, _ = entry
            with torch.no_grad():  # always (privacy 5): a .data or NumPy write is not counted
                if tensor.shape != initial.shape:
                    tensor.resize_(initial.shape)
                tensor.copy_(initial)


_PY_ARRAY = array.array
"""Python's ``array.array`` (follow-up of the fortieth review of issue 15, privacy 6: kept a
forward's running mean for the next users as a NumPy array did before mechanisms 4)."""

_RANDOM = (np.random.Generator, np.random.BitGenerator, np.random.RandomState, random.Random)
"""Random generators of NumPy and Python a forward may draw from (a dropout or augmentation).

Follow-up of the fortieth review of issue 15 (privacy 5): mechanisms 5 set back a
``torch.Generator`` attribute only; a dropout drawing from ``np.random.default_rng(0)``,
``np.random.RandomState(0)`` or ``random.Random(0)`` kept a state counting earlier users'
batches, so user 3's update after users 0-2 differed from its own.
"""


def _random_state(generator: object) -> object:
    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    if isinstance(generator, np.random.BitGenerator):
        return generator.state
    if isinstance(generator, np.random.RandomState):
        return generator.get_state()
    return generator.getstate()  # random.Random


def _set_random(generator: object, state: object) -> None:
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    elif isinstance(generator, np.random.BitGenerator):
        generator.state = state
    elif isinstance(generator, np.random.RandomState):
        generator.set_state(state)
    else:
        generator.setstate(state)


def _contents(value: list | dict | set | collections.deque) -> list | dict | set:
    return list(value) if isinstance(value, (list, collections.deque)) else value.copy()


class ModelLayout:
    """The flat layout of :class:`~fedprivopt.clients.trainer.LocalTrainer`'s model (a mixin)."""

    # ---------------------------------------------------------------------------- layout
    def _layout(self, state: dict[str, torch.Tensor]) -> list[_Entry]:
        entries: list[_Entry] = []
        seen: set[int] = set()
        start = 0
        for name, shape, size in zip(
            self.spec.names, self.spec.shapes, self.spec.sizes, strict=True
        ):
            tensor = state[name]
            is_param = isinstance(tensor, torch.nn.Parameter)
            if is_param:
                if id(tensor) in seen:
                    raise ValueError(
                        f"parameter {name!r} appears twice in the state dict (tied weights are "
                        "not supported by LocalTrainer)"
                    )
                seen.add(id(tensor))
            trainable = is_param and tensor.requires_grad
            if trainable and tensor.dtype != self.spec.dtype:
                raise ValueError(
                    f"parameter {name!r} has dtype {tensor.dtype}; LocalTrainer needs every "
                    f"trainable parameter in the flat dtype {self.spec.dtype}"
                    + self._flat_dtype_source(state)
                )
            entries.append(_Entry(name, start, start + size, shape, tensor, trainable))
            start += size
        missing = [
            n for n, p in self.model.named_parameters() if p.requires_grad and id(p) not in seen
        ]
        if missing:
            raise ValueError(f"trainable parameters {missing} are not in the model's state dict")
        if not any(e.trainable for e in entries):
            # thirty-second review of issue 15 (models, finding 3): autograd's "`inputs` argument
            # to `grad()` cannot be empty" traceback at the first local step
            text = (
                f"the model of {type(self.task).__name__}.build_model() has no trainable "
                "parameter (a torch.nn.Parameter with requires_grad): there is nothing to train"
            )
            raise sent_as(TaskError(text), text)  # a node's reply may say it: no user's data
        return entries

    def _flat_dtype_source(self, state: dict[str, torch.Tensor]) -> str:
        """The end of the refusal of a parameter's dtype: which entry made the flat dtype.

        Thirty-fourth review of issue 15 (tasks, finding 5): a float32 model with one float64
        buffer (``torch.from_numpy`` of a NumPy mean) was refused as ``parameter 'weight' has
        dtype torch.float32; LocalTrainer needs every parameter in the flat dtype
        torch.float64``, naming neither the buffer nor why the flat dtype was float64.
        """
        for name, value in state.items():
            if value.dtype == self.spec.dtype:
                kind = "parameter" if isinstance(value, torch.nn.Parameter) else "buffer"
                return (
                    f" (the widest dtype of the state dict: {kind} {name!r} is {value.dtype}; "
                    "give the trainable parameters and the floating-point buffers one dtype)"
                )
        return " (a flat vector is float32 at least)"

    def _load(self, flat: torch.Tensor) -> None:
        """Make trainable parameters views of ``flat``; copy frozen ones and buffers from it.

        Everything else of the model is first set back to what :meth:`Task.build_model` returned
        (:class:`ModelAtBuild`): buffers outside the state dict (``persistent=False``,
        thirty-fourth review of issue 15, tasks, finding 6), and what the model's forward set on
        itself (thirty-sixth review, tasks, finding 1), so that no user's update depends on the
        data of the users trained before it on the same trainer.
        """
        self._at_build.restore()
        for e in self._entries:
            chunk = flat[e.start : e.stop].view(e.shape)
            if e.trainable:
                e.tensor.data = chunk
            else:
                with torch.no_grad():
                    if not e.tensor.dtype.is_floating_point and e.tensor.dtype != torch.bool:
                        chunk = torch.round(chunk)
                    e.tensor.copy_(chunk)

    def load_global(self, global_flat: torch.Tensor) -> torch.nn.Module:
        """Load ``global_flat`` into the trainer's model (a copy on :attr:`device`) and return it.

        The model is shared with :meth:`train`: the next call reloads it.

        Raises
        ------
        ValueError
            If ``global_flat`` does not fit the layout or holds no dense values (on the meta
            device, sparse or nested: torch's ``NotImplementedError`` before the forty-second
            review of issue 15, lead 2, the api reviewer's open row).
        """
        self.spec.check(global_flat, name="global_flat")
        problem = dense_problem(global_flat)
        if problem is not None:
            raise ValueError(f"global_flat must be a dense tensor with values: {problem}")
        self._load(global_flat.detach().to(device=self.device, dtype=self.spec.dtype).clone())
        return self.model
