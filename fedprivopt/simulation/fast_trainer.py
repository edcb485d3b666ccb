"""The fast engine's trainer of a list of users: the task's cohort trainer or LocalTrainer.

:class:`UserTrainer` trains the users of a request, in process or inside a ``fast-actors`` Ray
actor (:mod:`fedprivopt.simulation.fast`): ``vectorized``, the task's cohort trainer
(``task.cohort_trainer``), a chunk of users at once, or ``sequential``,
:class:`~fedprivopt.clients.LocalTrainer`, one user at a time (any task; distributed-noise mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from fedprivopt.clients.trainer import LocalTrainer, clip_report
from fedprivopt.core.text import shown
from fedprivopt.models.task import TaskError
from fedprivopt.models.task_calls import task_attribute, task_call
from fedprivopt.privacy.aggregate_checks import KeptReads, refuse_shared_updates
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.privacy.sparse import RowSparse, RowSparseBatch
from fedprivopt.strategies.cohorts import refuse_shared_memory
from fedprivopt.strategies.requests import same_values
from fedprivopt.wire import ClientSettings

__all__ = ["UserTrainer"]


class UserTrainer:
    """Trains lists of users for requests: the task's cohort trainer or LocalTrainer.

    Parameters
    ----------
    task : Task
        The task.
    device : str
        Training device.
    vectorize : bool
        Use ``task.cohort_trainer`` when the task has one and the request adds no noise shares.
    chunk_users : int
        Users per cohort-trainer chunk.
    secure : bool
        Key client randomness from OS entropy instead of the request's seed.
    """

    def __init__(
        self, task, *, device: str, vectorize: bool, chunk_users: int, secure: bool
    ) -> None:
        self.task = task
        self.device = device
        self.secure = secure
        self.chunk_users = int(chunk_users)
        make = task_attribute(task, "cohort_trainer")  # its own error named (outputs 4)
        self.cohort = None
        if vectorize and callable(make):
            # its own exception (or a signature without these keywords) is one line naming it
            # (thirty-sixth review of issue 15, the tasks reviewer's report: a traceback, rc 1)
            call = f"{type(task).__name__}.cohort_trainer()"
            with task_call(call, f"{call} must return a cohort trainer"):
                self.cohort = make(device=device, chunk_users=chunk_users)
        if self.cohort is not None and not callable(getattr(self.cohort, "train_batches", None)):
            raise TaskError(
                f"{type(task).__name__}.cohort_trainer() must return a cohort trainer (with "
                f"train_batches) or None, got {shown(self.cohort)}"
            )
        self._local: LocalTrainer | None = None

    @property
    def local(self) -> LocalTrainer:
        """The sequential trainer (built on first use)."""
        if self._local is None:
            # built on the first train() call, maybe inside the caller's inference mode: its
            # model's tensors would be inference tensors, which training cannot use
            with torch.inference_mode(False):
                self._local = LocalTrainer(self.task, device=self.device)
        return self._local

    def mode(self, settings: ClientSettings) -> str:
        """``"vectorized"`` or ``"sequential"``: how a request with ``settings`` is trained."""
        local = settings.local
        # a cohort trainer with ``noise_shares`` adds distributed-noise shares itself
        quiet = local.noise_std == 0 == local.count_noise_std
        vectorized = self.cohort is not None and (quiet or self._declares_shares())
        return "vectorized" if vectorized else "sequential"

    def _declares_shares(self) -> bool:
        """The cohort trainer's ``noise_shares``, which must be a bool.

        Forty-sixth review of issue 15 (api 5): it was read by its truth, so a cohort trainer
        of one's own that wrote it as a method (``def noise_shares(self): return False``, a
        bound method is true) was trusted to add the distributed-noise shares it does not add:
        a toy round (33 entries, too few for ``_refuse_missing_share`` to tell) was released
        bit for bit as the noiseless one, charged and reported as noised (epsilon 7.551,
        ``noise_std`` 0.075). Anything but a bool is refused naming it.
        """
        shares = getattr(self.cohort, "noise_shares", False)
        if isinstance(shares, (bool, np.bool_)):
            return bool(shares)
        raise TaskError(
            f"{type(self.task).__name__}.cohort_trainer()'s noise_shares must be True or False "
            "(whether its train_batches adds the distributed-noise shares itself), got "
            f"{shown(shares)}"
        )

    def train(
        self,
        users: list[int],
        round_num: int,
        params: torch.Tensor,
        preconditioner: torch.Tensor | None,
        settings: ClientSettings,
        stream: str,
        bits: dict[int, float] | None = None,
    ) -> Iterator[tuple[int, Any] | RowSparseBatch]:
        """Yield ``(user, update)`` for ``users`` in their order.

        The cohort trainer yields a whole chunk of users as one batch (valid until the next
        entry is requested); the sequential trainer yields pairs. With ``settings.local.
        clip_bit`` each user's clip report (:func:`~fedprivopt.clients.trainer.clip_report`) is
        put into ``bits`` before its update is yielded.
        """
        cfg = settings.local
        rngs = RngFactory(seed=None, secure=True) if self.secure else RngFactory(seed=settings.seed)
        report = cfg.clip_bit and bits is not None
        # thirty-ninth review of issue 15 (api 1): the trainer trains from its own copy, and
        # the copy is compared with ``params`` (which it never sees) before each entry reaches
        # the aggregator and after the last; see _Copies.refuse_changed
        with torch.inference_mode(False):  # copies with version counters (follow-up, privacy)
            work = params.detach().clone()
            pre = None if preconditioner is None else preconditioner.detach().clone()
        copies = _Copies(work, pre, params, preconditioner, round_num, stream)
        if self.mode(settings) == "vectorized":
            batches = self.cohort.train_batches(
                work,
                users,
                round_num=round_num,
                config=cfg,
                rngs=rngs,
                preconditioner=pre,
                stream=stream,
            )
            listed = _Listed(batches, round_num, stream)
            for batch in _with_gradients(batches):
                copies.refuse_changed(self._batch_users(batch, report))
                if report:
                    for u, norm in zip(batch.users, batch.norms, strict=True):
                        bits[u] = clip_report(norm, cfg, rngs, round_num, (stream, u))
                if isinstance(batch, RowSparseBatch):
                    for i, user in enumerate(batch.users):
                        update = batch.update(i)
                        _refuse_missing_share((user, update.values), cfg, round_num, stream,
                                              entries=update.length)  # fmt: skip
                    yield batch
                else:  # dense updates (e.g. next-word prediction's): (user, update) pairs
                    pairs = batch.split()
                    _refuse_one_workspace(pairs, round_num)
                    split = _Listed([], round_num, stream)  # this batch's pairs (privacy 7)
                    lazily = not isinstance(pairs, (list, tuple))  # a list: refused above
                    for pair in pairs:
                        _refuse_missing_share(pair, cfg, round_num, stream)
                        listed.keep(pair)
                        split.keep(pair, versions=lazily)
                        yield pair
                    split.refuse_shared("a batch of the task's cohort_trainer")
            copies.refuse_changed([])
            listed.refuse_shared()
            return
        for u in users:
            result = self.local.train(
                work,
                user_id=u,
                round_num=round_num,
                config=cfg,
                rngs=rngs,
                preconditioner=pre,
                stream=stream,
            )
            copies.refuse_changed([u])
            if report:
                bits[u] = result.clip_bit
            yield u, result.delta

    def _batch_users(self, batch: object, report: bool) -> list[int]:
        """The users of a cohort trainer's ``batch`` (``[]`` when it names none), once checked.

        A batch needs ``split()`` (or is a :class:`RowSparseBatch`), and ``users`` and
        ``norms`` only with clip reports (the protocol of ``CohortTrainer.train_batches``).
        Follow-up of the thirty-ninth review of issue 15 (privacy 2): the per-entry check of
        api 1 read ``batch.users`` of every batch, so a batch with ``split()`` alone, which the
        fast engine trained before, ended in an ``AttributeError`` traceback (rc 1); an entry
        that is no batch (a ``(user, update)`` pair, ``None``) did before too.
        """
        call = f"{type(self.task).__name__}.cohort_trainer().train_batches()"
        if not isinstance(batch, RowSparseBatch) and not callable(getattr(batch, "split", None)):
            raise TaskError(
                f"{call} must yield batches of updates (a RowSparseBatch, or one with split() "
                f"giving (user, update) pairs), got {shown(batch)}"
            )
        users = getattr(batch, "users", None)
        if report and (users is None or getattr(batch, "norms", None) is None):
            raise TaskError(
                f"{call} must yield batches with users and norms when users report clip bits "
                f"(adaptive clipping), got {shown(batch)}"
            )
        if not isinstance(users, (list, tuple)):
            return []
        return [int(u) for u in users if isinstance(u, int) and not isinstance(u, bool)]

    def train_list(self, *args: Any) -> tuple[list[tuple[int, Any] | RowSparseBatch], dict]:
        """:meth:`train` as a list and the clip reports (what a Ray actor returns).

        Batches and updates own their memory. Fortieth review of issue 15 (api 3): a task's
        own ``cohort_trainer`` whose batches' ``split()`` gave views of a workspace it reused
        for the next chunk (a batch is valid until the next entry is requested, as the fast
        engine documents and the tag trainer does) was summed right in process, but on
        ``fast-actors`` the list held each dense update as a view: the users of a chunk got the
        last chunk's updates (users 4 and 5 of a toy cohort of 6 in chunks of 2 summed three
        times each, a sensitivity of 3C under a charge of C; users 0-3 not at all).
        """
        bits: dict[int, float] = {}
        entries = [_owned(e) for e in self.train(*args, bits)]
        return entries, bits


def _owned(entry: Any) -> Any:
    """``entry`` (a batch or a ``(user, update)`` pair) with its own copy of the update."""
    if isinstance(entry, RowSparseBatch):
        return entry.clone()
    if isinstance(entry, tuple) and len(entry) == 2:
        user, update = entry
        if isinstance(update, torch.Tensor):
            return user, update.clone()
        if isinstance(update, RowSparse):
            return user, RowSparse(update.rows.clone(), update.values.clone(), update.length)
    return entry


def _refuse_one_workspace(pairs: Any, round_num: int) -> None:
    """Raise ``ValueError`` when a batch's listed pairs hold two users' updates in one memory.

    Forty-fifth review of issue 15 (api 5; api 3 through a task's own ``cohort_trainer``): a
    trainer that trained a chunk's users one by one into one vector it reused and gave
    ``split()`` as a list of ``(user, work)`` pairs had the chunk's last user's update summed
    once for every user of the chunk (a sensitivity of chunk x C under a charge of C). A list
    (or tuple) of pairs holds its updates at once, so they must be distinct memory
    (:func:`~fedprivopt.strategies.cohorts.refuse_shared_memory`); a ``split()`` that is a
    generator may reuse its memory from one pair to the next (each is summed before the next).
    """
    if not isinstance(pairs, (list, tuple)):
        return
    entries = [
        p for p in pairs
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], int)
        and not isinstance(p[0], bool)
    ]  # fmt: skip
    refuse_shared_memory(round_num, entries)


class _Listed:
    """A cohort trainer's ``train_batches`` that is a list or tuple: its updates checked.

    Follow-up of the forty-fifth review of issue 15 (privacy 2; mechanisms 1 through the fast
    engine): a task's own ``cohort_trainer`` whose ``train_batches`` returned
    ``list(inner.train_batches(...))`` of the tag task's trainer (whose batches reuse two
    workspaces) was streamed into the aggregator, which could not tell: users 0 to 3 were
    summed with users 4 and 5's values (a sum of norm 0.248 where the users' own updates sum
    to 0.483), a sensitivity of several C under a charge of C. A list holds every batch at
    once, so its updates must be distinct memory: its row-sparse batches are checked before
    the first is summed (:func:`~fedprivopt.privacy.aggregate_checks.refuse_shared_updates`),
    and the dense pairs its batches' ``split()`` give after the last (an update that is its
    whole memory kept by a weak reference: one the aggregator has let go is no workspace that
    another update holds), before the round's noise is drawn, so nothing of it is released. A
    generator may reuse its memory from one batch to the next, as the built-in trainers do.
    """

    def __init__(self, batches: object, round_num: int, stream: str) -> None:
        self.listed = isinstance(batches, (list, tuple))
        self.reads = KeptReads()
        self.where = f"round {round_num}" + ("" if stream == "train" else f" ({stream})")
        if self.listed:
            sparse = [b for b in batches if isinstance(b, RowSparseBatch)]
            self._refuse(lambda: refuse_shared_updates(sparse), self._said)

    _said = "the batches the task's cohort_trainer listed"

    def keep(self, pair: object, *, versions: bool = False) -> None:
        """Remember a dense ``(user, update)`` pair of a listed batch (a weak reference).

        ``versions``: of any batch, with the version of its memory (:meth:`refuse_shared`).
        """
        if not ((self.listed or versions) and isinstance(pair, (tuple, list)) and len(pair) == 2):
            return
        user, update = pair
        tensor = update.values if isinstance(update, RowSparse) else update
        self.reads.keep(user, tensor, version=versions)

    def refuse_shared(self, said: str | None = None) -> None:
        """Raise ``ValueError`` when two kept updates still alive share memory.

        With ``versions`` kept, only those read at the same version of that memory (not
        written between their reads: the same values when summed); follow-up of the
        forty-fifth review of issue 15 (privacy 7): a batch's ``split()`` generator giving
        one update expanded over the chunk's users (``delta.expand(n, -1)``, e.g. a chunk's
        mean given to each) was summed once for each, where a generator that writes each user
        into its workspace before yielding it is summed right.
        """
        self._refuse(self.reads.refuse, said or self._said)

    def _refuse(self, check: Callable[[], None], said: str) -> None:
        try:
            check()
        except ValueError as error:
            raise ValueError(f"{self.where}: {said}: {error}") from None


def _refuse_missing_share(
    pair: Any, cfg: Any, round_num: int, stream: str, *, entries: int | None = None
) -> None:
    """Raise ``ValueError`` when a dense update plainly lacks its distributed-noise share.

    Fortieth review of issue 15 (api 8): a task's own ``cohort_trainer`` that declares
    ``noise_shares`` (it adds each user's share itself) but does not was trusted, so in
    distributed-noise mode a round's sum was released with no noise at all, charged as
    noised (``noise_std`` still reported). An honest update is its clipped part (norm at most
    C) plus a share ``N(0, s^2 I_d)``, whose norm is below ``s sqrt(d - 2 sqrt(50 d))`` with
    probability at most ``e^-50`` (Laurent and Massart's chi-square bound), so its norm is at
    least that minus C except with that probability. Only large models (``d > 200``) and
    shares large against C can be told; an update below the bound is refused before it
    reaches the aggregator, so nothing of the round is released. ``entries``: the model's
    length where the update holds fewer (a row-sparse update's values: a share has none
    outside its rows).
    """
    if cfg.noise_std <= 0 or not isinstance(pair, tuple) or len(pair) != 2:
        return
    user, update = pair
    if not isinstance(update, torch.Tensor) or update.layout != torch.strided:
        return  # the aggregator rejects it
    d = update.numel() if entries is None else int(entries)
    if d <= 200 or not update.is_floating_point():
        return
    low = cfg.noise_std * math.sqrt(d - 2.0 * math.sqrt(50.0 * d)) - (cfg.clip_norm or 0.0)
    if low <= 0:
        return
    norm = float(torch.linalg.vector_norm(update.detach().double()))
    if norm < 0.99 * low:  # a bfloat16 update's rounding moves its norm by at most 2^-8
        where = "" if stream == "train" else f" ({stream})"
        raise ValueError(
            f"round {round_num}{where}: the task's cohort_trainer declares noise_shares but user "
            f"{user}'s update has norm {norm:.4g}, where an update with its noise share (std "
            f"{cfg.noise_std:.4g} over {d} entries) has norm {low:.4g} or more except with "
            "probability e^-50: it did not add its share (noise-mode 'distributed'); add it, "
            "or set noise_shares = False; nothing of the cohort was released"
        )


def _with_gradients(batches: Iterable[Any]) -> Iterator[Any]:
    """The entries of ``batches``, each computed with gradients whatever the caller's mode.

    Follow-up of the forty-first review of issue 15 (privacy, open for the lead): ``drive_round``
    with the fast engine's trainer inside ``torch.inference_mode()`` (which api 4 let the
    server's rounds run in) ended in the task's ``loss()`` raising "Inference tensors do not
    track version counter". A cohort trainer's generator runs at each ``next()`` in the mode of
    the caller, so each step runs here with gradients on and inference mode off (``LocalTrainer.
    train`` alike, privacy 2); the caller's mode holds between the entries.
    """
    entries = iter(batches)
    while True:
        with torch.inference_mode(False), torch.enable_grad():
            try:
                entry = next(entries)
            except StopIteration:
                return
        yield entry


class _Copies:
    """The trainer's copies of a request's model and preconditioner, and the originals."""

    def __init__(self, work, pre, params, preconditioner, round_num: int, stream: str) -> None:
        self.pairs = [("global model", work, params), ("preconditioner", pre, preconditioner)]
        self.versions = [None if w is None else w._version for _, w, _ in self.pairs]
        self.round_num, self.stream = round_num, stream

    def refuse_changed(self, users: list[int]) -> None:
        """Raise ``ValueError`` when the trainer changed a copy in place.

        Thirty-ninth review of issue 15 (api 1): the thirty-eighth review's check
        (:meth:`~fedprivopt.strategies.core.ServerAlgorithm.refuse_changed_request`) compares
        the request's copies after the whole cohort, so a task's ``cohort_trainer`` that
        trained each user on its ``global_flat`` in place and put it back before returning
        passed it, and every user after the first started from the others' training (user 5's
        update of a toy round moved by as much as its own size with user 0 in the cohort or
        not); api 3: the preconditioner alike. The copies are compared before each entry
        reaches the aggregator, and their version counters catch a write put back within one
        entry (``global_flat.copy_(saved)``); the round is refused before its noise is drawn,
        so nothing of it is released.
        """
        for (name, work, given), version in zip(self.pairs, self.versions, strict=True):
            if work is None or (work._version == version and same_values(work, given)):
                continue
            where = "" if self.stream == "train" else f" ({self.stream})"
            after = " after its last entry"
            if users:
                first, last = min(users), max(users)
                after = f" after user {first}" if first == last else f" after users {first}..{last}"
            request = "request.params" if name == "global model" else "request.preconditioner"
            arg = "global_flat" if name == "global model" else "preconditioner"
            raise ValueError(
                f"round {self.round_num}{where}: the task's cohort_trainer (or its trainer) "
                f"changed the {name} it was given ({arg}, {request}) in place{after}: a user "
                f"trained after that started from other users' training; train on a copy "
                f"({arg}.clone()); nothing of the cohort was released"
            )
