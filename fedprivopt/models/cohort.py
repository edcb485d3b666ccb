"""What the vectorized cohort trainers of the tasks share.

:class:`CohortTrainer` holds the settings every cohort trainer takes (task, device, users per
chunk, torch threads for the local steps), checks the global model and the preconditioner a round
passes in, and gives :meth:`~CohortTrainer.train` (one update at a time) on top of a subclass's
:meth:`~CohortTrainer.train_batches` (a chunk of users at a time). The trainers:
:class:`~fedprivopt.models.tag_prediction_cohort.TagCohortTrainer` and
:class:`~fedprivopt.models.next_word_cohort.NextWordCohortTrainer`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from fedprivopt.core.local import LocalConfig
from fedprivopt.privacy.rng import RngFactory

__all__ = ["CohortTrainer"]


class CohortTrainer:
    """Base of the cohort trainers: settings, input checks, thread scope and :meth:`train`.

    Parameters
    ----------
    task
        The task whose users are trained.
    device : str or torch.device, optional
        Where to train (``cuda`` if available by default). Updates are returned on the CPU.
    chunk_users : int
        At most this many users are trained together, ``>= 1``.
    cpu_threads : int or None
        torch intra-op threads while the local steps run on the CPU, ``>= 1`` (restored
        afterwards); ``None`` leaves torch's setting alone.

    Subclasses set :attr:`length` (entries of the flat model) and define :meth:`train_batches`.

    Attributes
    ----------
    noise_shares : bool
        True where :meth:`train_batches` adds distributed-noise shares itself
        (``config.noise_std > 0``); otherwise the fast engine trains one user at a time in that
        mode.
    """

    length: int
    noise_shares = False

    def __init__(
        self,
        task,
        *,
        device: str | torch.device | None = None,
        chunk_users: int = 256,
        cpu_threads: int | None = 1,
    ):
        if isinstance(chunk_users, bool) or int(chunk_users) < 1:
            raise ValueError(f"chunk_users must be an integer >= 1, got {chunk_users!r}")
        if cpu_threads is not None and (isinstance(cpu_threads, bool) or int(cpu_threads) < 1):
            raise ValueError(f"cpu_threads must be an integer >= 1 or None, got {cpu_threads!r}")
        self.task = task
        self.chunk_users = int(chunk_users)
        self.cpu_threads = None if cpu_threads is None else int(cpu_threads)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)

    def train(
        self,
        global_flat: torch.Tensor,
        users: Sequence[int],
        *,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        preconditioner: torch.Tensor | None = None,
        stream: str = "train",
    ) -> Iterator[tuple[int, object]]:
        """Yield ``(user, clipped update)`` for ``users``, in their order.

        Arguments mean what they mean for :meth:`~fedprivopt.clients.LocalTrainer.train`. Each
        update owns its tensors; :meth:`train_batches` gives the same updates a chunk at a time.
        """
        for batch in self.train_batches(
            global_flat, users, round_num=round_num, config=config, rngs=rngs,
            preconditioner=preconditioner, stream=stream,
        ):  # fmt: skip
            yield from batch.split()

    def train_batches(
        self,
        global_flat: torch.Tensor,
        users: Sequence[int],
        *,
        round_num: int,
        config: LocalConfig,
        rngs: RngFactory,
        preconditioner: torch.Tensor | None = None,
        stream: str = "train",
    ) -> Iterator:
        """Yield the clipped updates of ``users``, a chunk at a time (each with ``split()``)."""
        raise NotImplementedError

    def checked_inputs(
        self, global_flat: torch.Tensor, preconditioner: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The global model and the preconditioner on :attr:`device`, after checking them.

        Raises
        ------
        ValueError
            If ``global_flat`` is not a flat vector of :attr:`length` entries, or the
            preconditioner has another shape or is not finite and > 0 everywhere.
        """
        if global_flat.dim() != 1 or global_flat.numel() != self.length:
            raise ValueError(
                f"global_flat must be a flat vector of {self.length} entries, got shape "
                f"{tuple(global_flat.shape)}"
            )
        model = global_flat.detach().to(self.device)
        if preconditioner is None:
            return model, None
        if preconditioner.shape != global_flat.shape:
            raise ValueError("preconditioner must have the layout of global_flat")
        precond = preconditioner.detach().to(device=self.device, dtype=model.dtype)
        if not bool(torch.all(torch.isfinite(precond) & (precond > 0))):
            raise ValueError("preconditioner must be finite and > 0 everywhere")
        return model, precond

    @contextmanager
    def _step_threads(self) -> Iterator[None]:
        """Run the block with :attr:`cpu_threads` intra-op threads (on the CPU), then restore."""
        threads = torch.get_num_threads()
        if self.cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
