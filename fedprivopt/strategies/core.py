"""Engine-agnostic server logic: one round as a coroutine over training requests.

A :class:`ServerAlgorithm` owns everything the server knows: the global parameters, the sampler,
the aggregator (clip, sum, noise, fixed denominator), the server transform, the accountant and the
budget. A round is a generator: it yields :class:`TrainRequest` objects (which users to train, at
which parameters, with which preconditioner and client settings) and receives, for each request,
the updates that came back (``{user_id: flat update or None}``). Every engine — Flower's (through
:class:`~fedprivopt.strategies.flower.DPStrategy`) and the fast in-process one — drives the same
generator, so for the same seed they compute the same model.

Named strategies are small subclasses: ADADP asks for two cohorts per round, DP2 broadcasts its
delayed preconditioner in adaptive rounds, AdaDPS broadcasts the public side information.

The request and result types live in :mod:`fedprivopt.strategies.requests` (re-exported here),
the checkpoint of an algorithm in :mod:`fedprivopt.strategies.state`, its noised aggregation (the
aggregator and tree noise it builds, one cohort's noised mean) in
:mod:`fedprivopt.strategies.aggregation`, its sampling, the noised mean a caller's ``aggregate``
asks for and the privacy events it is charged in :mod:`fedprivopt.strategies.cohorts`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import torch

from fedprivopt import optim
from fedprivopt.core.checks import check_int, check_real
from fedprivopt.core.local import LocalConfig
from fedprivopt.core.text import shown
from fedprivopt.privacy.accounting import PrivacyAccountant
from fedprivopt.privacy.pld_guard import check_pld_ledger
from fedprivopt.privacy.rng import RngFactory, derive_seed
from fedprivopt.privacy.sampling import SamplingSpec
from fedprivopt.privacy.sparse import dense_problem
from fedprivopt.strategies.aggregation import AlgorithmAggregation, largest_noise_std
from fedprivopt.strategies.clipping import AdaptiveClipping
from fedprivopt.strategies.cohorts import AlgorithmCohorts
from fedprivopt.strategies.config import StrategyConfig
from fedprivopt.strategies.requests import (
    PartialRelease,
    ReportedUpdates,
    RoundResult,
    TrainRequest,
    Updates,
)
from fedprivopt.strategies.state import AlgorithmState
from fedprivopt.wire import ClientSettings

__all__ = [
    "ReportedUpdates",
    "RoundResult",
    "ServerAlgorithm",
    "TrainRequest",
    "Updates",
    "drive_round",
    "new_request",
    "round_number",
]


class ServerAlgorithm(AlgorithmCohorts, AlgorithmAggregation, AlgorithmState):
    """Server side of a (DP) federated strategy, independent of the transport.

    Parameters
    ----------
    config : StrategyConfig
        Validated hyperparameters.
    initial_params : torch.Tensor
        Flat initial model (its dtype is the model dtype; updates must match it).
    preconditioner : torch.Tensor, optional
        Public side information broadcast every round (AdaDPS); ignored by other strategies.
    user_offset : int
        ``>= 0``: the sampled population is ``config.population`` users whose ids are
        ``user_offset .. user_offset + population - 1`` (the task's users below ``user_offset``
        are public users who opted out of privacy: never sampled, accounted or trained on
        privately). The sampler draws ``0 .. population - 1`` and :meth:`sample` adds the offset,
        so sampling, sample rate and accounting are those of the private population.
    frozen : torch.Tensor, optional
        Boolean vector of the model's length: coordinates of parameters that never train
        (:func:`~fedprivopt.models.task.frozen_mask`). ``_aggregate_in_round`` sets them to zero in
        the noised mean (post-processing), so they keep their initial values.
    """

    def __init__(
        self,
        config: StrategyConfig,
        initial_params: torch.Tensor,
        *,
        preconditioner: torch.Tensor | None = None,
        user_offset: int = 0,
        frozen: torch.Tensor | None = None,
    ) -> None:
        if not isinstance(initial_params, torch.Tensor):
            # forty-sixth review of issue 15 (api 7): a NumPy array (a ServerApp's model as
            # NumPy, or a list) ended in AttributeError: 'numpy.ndarray' object has no
            # attribute 'dim', naming nothing
            raise TypeError(
                "initial_params must be a flat floating-point torch.Tensor (arrays_to_flat or "
                f"torch.as_tensor of it), got {type(initial_params).__name__}"
            )
        if initial_params.dim() != 1 or not initial_params.dtype.is_floating_point:
            raise ValueError("initial_params must be a flat floating-point tensor")
        if frozen is not None and (
            frozen.dtype != torch.bool or frozen.shape != initial_params.shape
        ):
            raise ValueError(
                f"frozen must be a boolean vector of the model's length {initial_params.numel()}"
            )
        problem = None if frozen is None else dense_problem(frozen)
        if problem is not None:
            # forty-third review of issue 15 (api 3): a sparse mask ended the first round in
            # torch's NotImplementedError (aten::masked_fill_ on SparseCPU), a meta one the build
            raise ValueError(f"frozen must be a dense tensor with values: {problem}")
        # a copy (fortieth review of issue 15, api 7: the caller's mask was kept, so editing it
        # after the build, e.g. to reuse it, gave a frozen parameter the round's noise)
        self.frozen = None if frozen is None else frozen.to(initial_params.device).clone()
        if isinstance(user_offset, bool) or not isinstance(user_offset, int) or user_offset < 0:
            raise ValueError(f"user_offset must be an integer >= 0, got {shown(user_offset)}")
        self.user_offset = user_offset
        self.config = config
        self.params = initial_params.detach().clone()
        self.averaged: torch.Tensor | None = None
        self.round_num = 0
        self.rngs = RngFactory(seed=None, secure=True) if config.secure else RngFactory(config.seed)
        self.sampling = SamplingSpec(
            config.sampling,
            config.population,
            sample_rate=config.sample_rate if config.sampling == "poisson" else None,
            cohort_size=int(config.clients_per_round) if config.sampling == "fixed" else None,
        )
        self.sampler = self.sampling.sampler(self.rngs)
        self.tree_cohorts, self.tree_noise = self._make_tree(initial_params)
        # the last cohort sample() drew, by purpose: (round, users); what aggregate may sum in
        # secure mode or under tree aggregation, where a draw is not repeated
        self._drawn: dict[str, tuple[int, frozenset[int]]] = {}
        # secure mode: each unreleased round's draw, by purpose and round, given again (api 8;
        # follow-up, privacy 1: one draw a purpose let sample(2) between two sample(1) redraw 1)
        self._secure_draws: dict[tuple[str, int], tuple[int, ...]] = {}
        #: Task user ids that can be reached this round (deployment under tree aggregation;
        #: ``None``: all). Set by the engine before a round; ignored by sampled mechanisms.
        self.available_users: set[int] | None = None
        self._check_noise_fits(initial_params.dtype)
        self.aggregator = self._make_aggregator()
        self.clipping = None
        if config.adaptive:  # C stays where the noise std σ_Δ C fits the model's dtype
            limit = largest_noise_std(initial_params.dtype) / config.update_noise_multiplier
            self.clipping = AdaptiveClipping(config, self.aggregator.min_shares, limit)
        self.accountant = PrivacyAccountant(accountant=config.accountant)
        if config.accountant == "pld" and self.round_events():
            # a PLD too large for memory fails here, before training, not at the first ε query
            planned = config.num_server_rounds * self.events_per_round
            event = self.round_event().single_gaussian()
            check_pld_ledger([(event, planned)], self.accountant.pld_discretization)
        self.side_information = preconditioner
        self.transform = self.make_transform()
        self.opt_state = self.init_state()
        self.stopped_reason: str | None = None
        #: ``(round, stream)`` of the noised sums computed since the last round finished: one
        #: computed again (a round retried after its second cohort failed) is refused.
        self._aggregated: set[tuple[int, str]] = set()
        #: ``(round, point)``: the half-step point a round sent its second cohort before it
        #: finished (ADADP), kept by :meth:`state_dict` (thirty-ninth review of issue 15, api 4)
        self.partial_point: tuple[int, torch.Tensor] | None = None
        #: Called as ``(round_num, events, point)`` before a round sends out a point computed
        #: from a noised sum of the same round (ADADP's half step), so that the run's ledger
        #: records that part of the round first (``RunWriter`` sets it; ``None``: no ledger).
        self.on_partial_release: PartialRelease | None = None

    # -- construction hooks ------------------------------------------------------------------

    def make_transform(self) -> optim.ServerTransform | None:
        """Server optimizer of this strategy (each named strategy defines its own)."""
        raise NotImplementedError

    def init_state(self) -> Any:
        """The server optimizer's initial state."""
        return None if self.transform is None else self.transform.init(self.params)

    # -- one round -----------------------------------------------------------------------------

    def client_settings(self, *, clip_norm: float | None = None) -> ClientSettings:
        """What every client of a request is told (``clip_norm``: DP2's adaptive-phase norm).

        With adaptive clipping the clip norm is the round's ``C`` and clients report their bit
        (and, in distributed mode, add their share of the count noise).
        """
        c = self.config
        if clip_norm is not None:  # 0, True or False silently became the configured C (a
            # short review of the Python API, issue 15)
            clip_norm = check_real("clip_norm", clip_norm, low=0.0, low_open=True)
        if clip_norm is None and c.adaptive:
            clip_norm = self.current_clip_norm()
        clip = (clip_norm or c.clip_norm) if c.private else 0.0
        local = LocalConfig(
            learning_rate=c.local_learning_rate,
            epochs=c.local_epochs,
            batch_size=c.batch_size,
            max_examples=c.max_examples or None,
            clip_norm=float(clip) or None,
            noise_std=self.aggregator.share_std() * (clip / c.clip_norm if c.private else 0.0),
            clip_bit=c.adaptive,
            count_noise_std=self.clipping.share_std() if self.clipping is not None else 0.0,
        )
        # Clients get a seed derived one-way from the root seed: the root seed keys the server
        # noise and the sampling, and a client that knew it could subtract the noise.
        return ClientSettings(
            local=local,
            seed=derive_seed(c.seed, "clients"),
            secure=c.secure,
            report_private_metrics=not c.private,
        )

    def broadcast_preconditioner(self) -> torch.Tensor | None:
        """Preconditioner sent to clients this round (none by default)."""
        return None

    # -- adaptive clipping ---------------------------------------------------------------------

    def current_clip_norm(self) -> float | None:
        """The clip norm of this round (``None``: ``clip-norm``).

        With adaptive clipping the adaptive ``C`` of the round's phase
        (:class:`~fedprivopt.strategies.clipping.AdaptiveClipping`), else
        :meth:`round_clip_norm`.
        """
        fixed = self.round_clip_norm()
        return fixed if self.clipping is None else self.clipping.clip_norm(fixed)

    def round_clip_norm(self) -> float | None:
        """The clip norm of this round when it is not ``clip-norm`` (DP2's adaptive rounds)."""
        return None

    def round_metrics(self) -> dict[str, float]:
        """Metrics of this round's shape, taken before the server step (DP2's phase)."""
        return {}

    def step_metrics(self, noise_std: float) -> dict[str, float]:
        """Metrics of the server step given the noise std it is passed (DP-FedAvg's rate)."""
        del noise_std
        return {}

    def run_round(self, round_num: int) -> Generator[TrainRequest, Updates, RoundResult]:
        """One round of a single-cohort strategy (override for other shapes)."""
        round_num = round_number(round_num)
        self._refuse_spent_round(round_num)  # before its sample (forty-third review, api 6)
        clip = self.current_clip_norm()
        users = self.sample(round_num)
        drawn = self._drawn.get("sampling")  # this draw's own record (identity, not value)
        preconditioner = self.broadcast_preconditioner()
        request = new_request(
            round_num, users, self.params, preconditioner, self.client_settings(clip_norm=clip)
        )
        try:
            updates = yield request
        except GeneratorExit:
            # forty-seventh review of issue 15 (wire 1): a round left at its cohort (drive_round's
            # callback raised, a ServerApp's configure_train of the round again) kept its cohort
            # checked in to the tree's period; nothing of it was released. Only while its draw
            # is the last one: closed late (after load_state_dict, the same seeded cohort drawn
            # and released by another attempt) it would check released users out
            if self._drawn.get("sampling") is drawn:
                self._check_out(round_num, users)
            raise
        try:
            agg = self._aggregate_in_round(
                round_num, updates, clip_norm=clip, cohort=users, count_now=False
            )
            self.refuse_changed_request(request, self.params, preconditioner)
        except Exception:
            self._check_out(round_num, users)  # nothing of it was released (api 7)
            raise
        self._count_cohort()  # adaptive clipping's count of a cohort not refused (api 4)
        try:
            noise_std = self.optimizer_noise_std(agg, clip)
            metrics = {**agg.metrics, **self.round_metrics(), **self.step_metrics(noise_std)}
            step, self.opt_state = self.transform.update(
                agg.delta_tilde, self.opt_state, self.params, noise_variance=noise_std**2
            )
            self.params = self.params + step
        except BaseException:
            self.charge_begun_period(round_num)  # the period's noise is drawn (follow-up 1)
            raise
        return self._finish(round_num, users, metrics, agg.rejected)

    def refuse_changed_request(
        self,
        request: TrainRequest,
        params: torch.Tensor,
        preconditioner: torch.Tensor | None = None,
        *,
        stream: str = "",
    ) -> None:
        """Raise ``ValueError`` when the trainer of ``request`` changed its copies in place.

        Called after the cohort's updates were aggregated (a streamed cohort is trained as it
        is summed). Users trained after such a change started from a point that holds other
        users' training (thirty-eighth review of issue 15, api 1; from the command line a task
        whose own cohort_trainer trained on its global_flat in place released its cohort's
        unnoised sum in the model, rc 0, and now ends rc 2 with this line), so the noised sum is
        not used: nothing of it was released, and the round may run again (``stream``: the
        stream ``_aggregate_in_round`` summed it under, whose mark of a computed sum is removed).
        """
        changed = request.changed_in(params, preconditioner)
        if changed is None:
            return
        self._uncounted = None  # its noised count is not released (forty-third review, api 4)
        self._aggregated.discard((request.round_num, stream))
        self._undo_tree_release(request.round_num)
        where = "" if request.stream == "train" else f" ({request.stream})"
        raise ValueError(
            f"round {request.round_num}{where}: the train callback (or the task's cohort_trainer) "
            f"changed request.{changed} in place (a model whose parameters are views of it, "
            "torch.nn.utils.vector_to_parameters, trains it): a user trained "
            "after that started from other users' training; copy it before training on it "
            "(request.params.clone()); nothing of the cohort was released"
        )

    def _finish(
        self, round_num: int, users: list[int], metrics: dict[str, float], rejected: dict
    ) -> RoundResult:
        events = self.uncharged_events(round_num)
        if events:
            self.accountant.step(events)
        self._partial_charged = None
        self.partial_point = None
        # a plain int: forty-second review of issue 15 (api 1), round_number
        self.round_num = round_number(round_num)
        # the sums of later rounds stay marked: forty-third review of issue 15 (api 1), a
        # caller's aggregate(3, ...) before rounds 1 and 2 lost its mark here, and round 3 run
        # after them drew the same seeded noise (the releases differed by the left-out user's
        # clipped update without noise)
        self._aggregated = {(r, s) for r, s in self._aggregated if r > self.round_num}
        self._secure_draws = {k: v for k, v in self._secure_draws.items() if k[1] > self.round_num}
        self._average()
        metrics = {**metrics, **(self.clipping.step() if self.clipping is not None else {})}
        out = {"cohort_size": float(len(users)), **metrics, "epsilon": self.epsilon()}
        # a copy, as output_params() gives (thirty-eighth review of issue 15, api 4)
        return RoundResult(round_num, self.params.detach().clone(), out, dict(rejected))

    def _average(self) -> None:
        """Fold the round's released iterate into the moving average (``ema-decay > 0``)."""
        beta = self.config.ema_decay
        if beta <= 0:
            return
        if self.averaged is None:
            self.averaged = self.params.detach().clone()
        else:
            self.averaged = beta * self.averaged + (1.0 - beta) * self.params

    def output_params(self) -> torch.Tensor:
        """The model a run evaluates and reports.

        With ``ema-decay = β > 0`` the exponential moving average of the released iterates,
        ``a_1 = θ_1`` and ``a_t = β a_{t-1} + (1 - β) θ_t``; otherwise (and before the first
        round) the current iterate ``θ_t``. The average is a function of models that were
        released already (each is recorded in the ledger), so it is post-processing: it costs no
        privacy and is never broadcast to clients. It damps the noise that the last steps leave
        in the iterate (De et al. 2022 report the same for DP-SGD).

        A copy: thirty-eighth review of issue 15 (api 4), the algorithm's own tensor was
        returned (and as ``RoundResult.params``), so a caller that evaluated it in a model
        loaded with ``torch.nn.utils.vector_to_parameters`` (its parameters views of it) and
        fine-tuned that model on users' data moved the model the next round starts from by
        that training, released with no noise of its own (+50 in every entry).
        """
        return (self.params if self.averaged is None else self.averaged).detach().clone()


def round_number(round_num: object) -> int:
    """``round_num`` as a plain ``int >= 1`` (what the algorithm keeps as its round).

    Forty-second review of issue 15 (api 1): ``run_round`` kept the round it was given as the
    algorithm's round. Given a NumPy integer (``for r in np.arange(1, 4): drive_round(alg, r,
    train)``) the algorithm's ``state_dict()`` held ``round = np.int64(3)``, which its own
    ``load_state_dict`` refused (and JSON cannot write); given an ``int`` subclass whose
    comparisons lie, ``drive_round(alg, 1, train)`` after it was not refused as released
    already: round 1 ran again with the same seeded noise, so the two released means differed
    by the left-out user's clipped update without noise (0.01 in every entry), charged as two
    independent releases.
    """
    return check_int("round_num", round_num, 1)


def new_request(*args: Any) -> TrainRequest:
    """``TrainRequest(*args)``, its copies made outside ``torch.inference_mode``.

    Forty-first review of issue 15 (api 4): ``drive_round`` (or ``run_round``) called inside
    ``torch.inference_mode()`` (server code that needs no gradients) made the request's copies
    inference tensors, which keep no version counter, and every round ended in torch's
    ``RuntimeError: Inference tensors do not track version counter``. The copies are ordinary
    tensors, so a trainer's in-place write to them is seen (:meth:`TrainRequest.changed_in`).
    """
    with torch.inference_mode(False):
        return TrainRequest(*args)


def drive_round(
    algorithm: ServerAlgorithm,
    round_num: int,
    train: Callable[[TrainRequest], Updates],
) -> RoundResult:
    """Run one round in process: ``train(request)`` returns the updates of each request's users.

    This is what every engine does; the Flower adapter does it through messages.
    """
    rounds = algorithm.run_round(round_num)
    request = next(rounds)
    try:
        while True:
            request = rounds.send(train(request))
    except StopIteration as stop:
        return stop.value
    finally:
        rounds.close()  # a callback's error leaves the round now (its cohort checked out)
