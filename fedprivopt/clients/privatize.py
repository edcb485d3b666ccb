"""The client's privacy step, as a public function: clip the whole update, then add its noise share.

Whatever trains the model (fedprivopt's :class:`~fedprivopt.clients.LocalTrainer` or a user's
own training loop in their own Flower ClientApp), the update that leaves the device in DP mode
goes through :func:`privatize_update`:

1. an update with a NaN or Inf entry (local training diverged) becomes the zero vector, reported
   with norm ``inf`` and as clipped: it has no direction to keep, and a zero contribution is
   always within the clip norm;
2. **clip** the whole flat update to L2 norm ``C`` (:func:`~fedprivopt.privacy.clip_l2`; ``C =
   None`` does not clip: non-private baselines only);
3. **noise share**: in distributed-noise mode add ``N(0, noise_std² I)`` drawn from an explicit
   generator, :func:`noise_generator` (keyed by ``(seed, round, "client-noise", stream, user)``,
   or seeded from the operating system's entropy in secure mode).

The server sends ``C``, ``noise_std``, the seed, secure mode, the round and the stream in every
train message (:mod:`fedprivopt.wire`; :class:`~fedprivopt.clients.messages.TrainMessage` reads
them), so a user's ClientApp gets exactly the update LocalTrainer would send for the same local
model. The server never trusts this step: it measures and re-clips every update it receives.

References
----------
H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, "Learning differentially private recurrent language
models", ICLR 2018.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch

from fedprivopt.core.checks import check_bool, check_int, check_real
from fedprivopt.core.text import shown
from fedprivopt.privacy.clip import (
    ClipResult,
    clip_l2,
    float_at_most,
    l2_norm,
    norm_error_bound,
)
from fedprivopt.privacy.noise import add_gaussian_noise
from fedprivopt.privacy.plain import foreign_tensor
from fedprivopt.privacy.rng import RngFactory

__all__ = [
    "NOISE_PURPOSE",
    "NoisedShare",
    "PrivateUpdate",
    "keep_as_noised",
    "keep_for_user",
    "noise_generator",
    "noised_std",
    "privatize_update",
    "privatized_for",
]

#: The purpose key of the clients' noise-share generators (:meth:`RngFactory.generator`).
NOISE_PURPOSE = "client-noise"


class PrivateUpdate(NamedTuple):
    """What :func:`privatize_update` returns.

    Attributes
    ----------
    vector : torch.Tensor
        The clipped update plus its noise share: what the client sends. Same shape, dtype and
        device as the input, in memory of its own (never the input's).
    norm : float
        L2 norm of the update before clipping; ``inf`` for an update with a NaN or Inf entry.
        **Private**: never sent in DP mode.
    clipped : bool
        Whether the update was scaled down (always true for a non-finite update).
    """

    vector: torch.Tensor
    norm: float
    clipped: bool


def _clip(delta: torch.Tensor, clip_norm: float | None) -> ClipResult:
    if clip_norm is None:
        return ClipResult(delta, l2_norm(delta), False)
    return clip_l2(delta, clip_norm)


def privatize_update(
    update: torch.Tensor,
    *,
    clip_norm: float | None,
    noise_std: float = 0.0,
    generator: torch.Generator | None = None,
    clip: Callable[[torch.Tensor, float | None], ClipResult] | None = None,
    add_noise: Callable[[torch.Tensor, float, torch.Generator], torch.Tensor] | None = None,
) -> PrivateUpdate:
    """Clip a user's whole update to L2 norm ``clip_norm`` and add its noise share.

    Parameters
    ----------
    update : torch.Tensor
        The user's update ``Δ = w_local − w_global`` as one flat floating-point vector, in the
        layout of the global model the server sent (:meth:`fedprivopt.clients.messages.
        TrainMessage.flatten` makes it from a state dict).
    clip_norm : float or None
        The clip norm ``C > 0`` (the message's ``clip-norm``); ``None`` does not clip
        (non-private baselines, whose messages carry ``clip-norm = 0``).
    noise_std : float
        Standard deviation ``>= 0`` of the noise share (the message's ``noise-std``); ``0``
        (server-noise mode) adds none.
    generator : torch.Generator, optional
        Source of the noise share, on ``update``'s device; required when ``noise_std > 0``.
        :func:`noise_generator` gives the one fedprivopt's clients use.
    clip, add_noise : callable, optional
        Replacements of the two steps (``clip(delta, clip_norm) -> ClipResult`` and
        ``add_noise(vector, std, generator) -> tensor``); :class:`~fedprivopt.clients.
        LocalTrainer` passes its overridable methods. By default
        :func:`~fedprivopt.privacy.clip_l2` and :func:`~fedprivopt.privacy.add_gaussian_noise`.

    Returns
    -------
    PrivateUpdate
        The vector to send, the pre-clip norm and whether it was clipped.

    Raises
    ------
    ValueError
        If ``update`` is not a dense floating-point tensor, ``clip_norm`` is not ``None`` or a
        finite real number ``> 0``, ``noise_std`` is not a finite real number ``>= 0``,
        ``noise_std > 0`` comes without a generator, or ``clip`` or ``add_noise`` is not
        callable.

    Examples
    --------
    >>> import torch
    >>> out = privatize_update(torch.tensor([3.0, 4.0]), clip_norm=1.0)
    >>> out.norm, out.clipped, round(float(out.vector.norm()), 6)
    (5.0, True, 1.0)
    """
    # twenty-fifth review of issue 15, finding 6: a clip_norm of 1+0j or [1] and a noise_std
    # of "1" or None raised TypeErrors naming nothing (float(), '>'), True a TypeError, a sparse
    # update NotImplementedError, and clip=5 failed inside; a 0-d tensor noise_std was taken
    if not isinstance(update, torch.Tensor) or not update.is_floating_point():
        tensor = isinstance(update, torch.Tensor)
        what = f"a {update.dtype} tensor" if tensor else f"a {type(update).__name__}"
        # not its values (follow-up, privacy 5): a user's update in an error's text
        raise ValueError(f"update must be a floating-point torch.Tensor, got {what}")
    if update.layout != torch.strided:
        raise ValueError(f"update must be a dense (strided) tensor, got layout {update.layout}")
    foreign = foreign_tensor(update)
    if foreign is not None:
        # forty-second review of issue 15 (api 4): an update of a tensor subclass whose own
        # norm read 0.001 came back unclipped (norm 200 where C = 1, clipped False), which in
        # distributed-noise mode the server sums up to C + s (sqrt(d) + 10), above C
        raise ValueError(f"update is {foreign}")
    # follow-up of the forty-second review of issue 15 (privacy 4): a plain tensor whose instance
    # carried its own detach (which clip_l2 measures through) read norm 0 and came back unclipped
    # (norm 1000 where C = 1); the steps below get a plain alias of it (no copy of the entries)
    update = torch.Tensor.detach(update)
    # thirty-eighth review of issue 15: a meta tensor ended in torch's RuntimeError and a float8
    # one in NotImplementedError ("isfinite" not implemented), before clip_l2's own refusal
    if update.device.type == "meta":
        raise ValueError("update must hold data, got a tensor on the meta device")
    if update.dtype.itemsize < 2:
        raise ValueError(
            f"update must be float16, bfloat16, float32 or float64, got {update.dtype}"
        )
    if clip_norm is not None:
        try:
            check_real("clip_norm", clip_norm, low=0.0, low_open=True)
            # follow-up of the fortieth review of issue 15 (privacy 2): C was read as the
            # nearest float (0.1 > Fraction(1, 10)), and an update of that norm was returned
            # unclipped; it is read as the largest float not above it, as clip_l2 reads it
            clip_norm = float_at_most(clip_norm)
            if clip_norm <= 0.0:
                raise ValueError("clip_norm")
        except ValueError:
            raise ValueError(
                f"clip_norm must be None or a finite number > 0, got {shown(clip_norm)}"
            ) from None
    noise_std = check_real("noise_std", noise_std, low=0.0)
    for name, step in (("clip", clip), ("add_noise", add_noise)):
        if step is not None and not callable(step):
            raise ValueError(f"{name} must be callable or None, got {shown(step)}")
    if noise_std > 0 and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator when noise_std > 0, got {shown(generator)}"
        )
    clip = _clip if clip is None else clip
    with torch.no_grad():
        if bool(torch.isfinite(update).all()):
            result = clip(update, clip_norm)
            if clip is not _clip:
                result = _checked_clip(result, update, clip_norm)
            vector, norm, clipped = result.vector, result.norm, result.clipped
        else:
            vector, norm, clipped = torch.zeros_like(update), math.inf, True
        if noise_std > 0:
            if add_noise is None:
                vector = add_gaussian_noise(vector, noise_std, generator=generator)
            else:
                before = vector.clone()  # a replacement may add in place
                state = generator.get_state()
                vector = add_noise(vector, noise_std, generator)
                _refuse_other_tensor("add_noise", vector, update)
                _refuse_missing_noise(vector, before, noise_std)
                _refuse_changed_update(vector, before, noise_std)
                _refuse_unused_generator(generator, state)
        if _shares_memory(vector, update):
            # forty-fifth review of issue 15 (api 2): an update within C (server-noise mode)
            # came back as the caller's own tensor, so a ClientApp that computed each user's
            # delta into one workspace it reused sent the last user's update for every user
            # whose update was not clipped (the server summed it once for each of them)
            vector = vector.clone()
    if noise_std > 0:
        keep_as_noised(vector, noise_std)
    return PrivateUpdate(vector, float(norm), bool(clipped))


class NoisedShare(float):
    """A clip-bit report with its count noise: the float, and the std of the noise it holds.

    :func:`~fedprivopt.clients.trainer.clip_report` (``TrainMessage.clip_bit``, fedprivopt's
    trainer) gives one in distributed mode; :func:`~fedprivopt.clients.reply_updates` sends
    nothing else there. Arithmetic on it gives a plain float (no longer a report). Follow-up of
    the forty-seventh review of issue 15 (privacy 6; mechanisms 2's and wire 4's twin): a
    ClientApp of one's own reporting ``count_share(bit, 1e-9, generator)`` (the share std
    mistaken) sent a bit with no count noise to speak of (0.5000000001): the server keeps it
    (neither an exact bit nor beyond its bound) and releases the count noised by the top-up of
    missing shares only, reported with the full count noise.
    """

    std: float

    def __new__(cls, value: float, std: float) -> NoisedShare:
        """``value`` as a report holding count noise of std ``std``."""
        share = super().__new__(cls, value)
        share.std = float(std)
        return share


#: id of a vector :func:`privatize_update` noised -> (weak reference, noise std, version).
_NOISED: dict[int, tuple[weakref.ref, float, int]] = {}


def keep_as_noised(vector: torch.Tensor, std: float) -> None:
    """Remember ``vector`` as an update that holds a noise share of std ``std``, as it is now.

    :func:`privatize_update` keeps its result so; a copy of it moved, not computed (another
    dtype or device, entries reordered), is kept by whoever made it. :func:`noised_std` reads
    it back while the vector is unchanged (its version counter; a write through ``.data`` or
    NumPy is not seen), and for a copy of it (same shape and values, in its dtype or another).
    """
    key = id(vector)

    def forget(ref: weakref.ref, key: int = key) -> None:
        entry = _NOISED.get(key)
        if entry is not None and entry[0] is ref:
            del _NOISED[key]

    _NOISED[key] = (weakref.ref(vector, forget), float(std), vector._version)


def noised_std(vector: object) -> float:
    """The noise std :func:`keep_as_noised` kept ``vector`` with, unchanged since; else ``0``.

    Follow-up of the forty-seventh review of issue 15 (privacy 3; wire 4): a ClientApp of one's
    own that sent its clipped (or raw) update without its noise share in a distributed-noise
    round (it forgot ``request.privatize``, or clipped by itself) had it accepted as a share: on
    a model of at most 200 entries the server cannot tell (``NoisyMeanAggregator.share_floor``
    is 0), and a round of such replies was released with no noise at all (``[0.0125 0.0125
    0.0125]`` exactly), reported with noise std 0.559 and charged epsilon 3.41.
    :func:`~fedprivopt.clients.replies.reply_updates` refuses such an update on the node.
    """
    entry = _NOISED.get(id(vector))
    if entry is not None and entry[0]() is vector and vector._version == entry[2]:
        return entry[1]
    if not isinstance(vector, torch.Tensor) or not vector.is_floating_point():
        return 0.0
    if vector.layout != torch.strided or vector.device.type == "meta":
        return 0.0
    # a copy of a kept vector, unchanged (.detach(), .cpu() of a CUDA one, .clone(), another
    # floating dtype): its values
    best = 0.0
    for ref, std, version in list(_NOISED.values()):
        kept = ref()
        if kept is None or kept._version != version or kept.shape != vector.shape or std <= best:
            continue
        same = kept.to(device=vector.device, dtype=vector.dtype)  # .float() of a float16 one
        if torch.equal(same, vector):
            best = std
    return best


#: id of a vector TrainMessage.privatize made for a user -> (weak reference, user, version).
_FOR_USER: dict[int, tuple[weakref.ref, int, int]] = {}


def keep_for_user(vector: torch.Tensor, user: int) -> None:
    """Remember ``vector`` as the update privatized for ``user``, as it is now.

    :meth:`~fedprivopt.clients.messages.TrainMessage.privatize` keeps its result so;
    :func:`privatized_for` reads it back.
    """
    key = id(vector)

    def forget(ref: weakref.ref, key: int = key) -> None:
        entry = _FOR_USER.get(key)
        if entry is not None and entry[0] is ref:
            del _FOR_USER[key]

    _FOR_USER[key] = (weakref.ref(vector, forget), int(user), vector._version)


def privatized_for(vector: object) -> frozenset[int]:
    """The users :func:`keep_for_user` kept ``vector`` (or a copy of it, unchanged) for.

    The vector itself gives its own user; a copy (same shape and values, in any floating
    dtype) every user a kept vector of those values was privatized for; anything else none.
    Forty-eighth review of issue 15 (privacy 1): a ClientApp of one's own that sent one user's
    privatized update for every user as copies (``updates[u] = private.vector.clone()`` after
    its loop, as the shared-memory refusal advises ``.clone()``) had it summed once for each
    user: a sensitivity of k C under a charge of C.
    """
    entry = _FOR_USER.get(id(vector))
    if entry is not None and entry[0]() is vector and vector._version == entry[2]:
        return frozenset((entry[1],))
    if not isinstance(vector, torch.Tensor) or not vector.is_floating_point():
        return frozenset()
    if vector.layout != torch.strided or vector.device.type == "meta":
        return frozenset()
    users = set()
    for ref, user, version in list(_FOR_USER.values()):
        kept = ref()
        if kept is None or kept._version != version or kept.shape != vector.shape:
            continue
        if torch.equal(kept.to(device=vector.device, dtype=vector.dtype), vector):
            users.add(user)
    return frozenset(users)


def _refuse_other_tensor(step: str, vector: object, update: torch.Tensor) -> None:
    """Raise ``ValueError`` unless a replacement ``step`` gave a plain tensor like ``update``.

    Forty-sixth review of issue 15 (api 1): what ``clip`` or ``add_noise`` returned was sent as
    it was, so a replacement that changed the shape (``delta[:3]``), the dtype (float64 for a
    float32 update) or returned a tensor subclass broke :class:`PrivateUpdate`'s documented
    "same shape, dtype and device as the input".
    """
    if not isinstance(vector, torch.Tensor):
        # its type only (follow-up privacy 5): a user's values, not noised, leave a node in
        # an error's text (Flower sends it as the error reply's reason)
        raise ValueError(f"{step} must return a torch.Tensor, got a {type(vector).__name__}")
    foreign = foreign_tensor(vector)
    if foreign is not None:
        raise ValueError(f"{step} must return a plain torch.Tensor: its result is {foreign}")
    if (
        vector.layout != torch.strided
        or vector.shape != update.shape
        or vector.dtype != update.dtype
        or vector.device != update.device
    ):
        # not the shape it got (forty-seventh review of issue 15, egress 3): a clip keeping the
        # entries above a threshold (delta[delta.abs() > t]) sent how many a user's update has
        shape = "its shape" if vector.shape == update.shape else "another shape (not shown)"
        raise ValueError(
            f"{step} must return a dense tensor of the update's shape {tuple(update.shape)}, "
            f"dtype {update.dtype} and device {update.device}, got one of {shape}, dtype "
            f"{vector.dtype} on {vector.device} ({vector.layout})"
        )


def _least_noise_norm(std: float, entries: int) -> float:
    """A norm that ``N(0, std² I)`` over ``entries`` entries exceeds except with chance e^-50.

    The chi-square lower tail: ``P(X <= z d) <= (z e^(1 - z))^(d/2)`` for ``X`` of ``d`` degrees
    of freedom and ``0 < z < 1`` (Chernoff); ``z`` solves ``(d/2)(ln z + 1 - z) = -50``.
    """
    if entries <= 0 or std <= 0:
        return 0.0
    low, high = 0.0, 1.0  # (d/2)(ln z + 1 - z) rises from -inf at 0 to 0 at 1
    for _ in range(200):
        z = (low + high) / 2.0
        if z <= 0.0 or entries / 2.0 * (math.log(z) + 1.0 - z) < -50.0:
            low = z
        else:
            high = z
    return std * math.sqrt(low * entries)


def _refuse_missing_noise(vector: torch.Tensor, before: torch.Tensor, std: float) -> None:
    """Raise ``ValueError`` when a replacement ``add_noise`` plainly left out the noise share.

    Forty-seventh review of issue 15 (api 1): a replacement ``add_noise`` (a ``LocalTrainer``
    subclass overriding it, or ``add_noise=``) that returned the clipped update without its
    share (``out + noise`` whose sum was dropped, ``return delta``) was sent as it was: in
    distributed-noise mode a round of such updates was released with no noise at all, charged
    as noised (the server's own check, ``NoisyMeanAggregator.share_floor``, cannot tell for
    ``d <= 200`` and shares small against C). Here the share itself is known (what was added),
    so its norm is checked against the chi-square's e^-50 quantile, less the rounding of the
    sum (at most one unit roundoff of each entry) and 1% for a low-precision draw.
    """
    added = float(torch.linalg.vector_norm((vector.detach() - before).double()))
    unit = torch.finfo(vector.dtype).eps / 2.0
    rounding = 2.0 * unit * float(torch.linalg.vector_norm(vector.detach().double()))
    least = 0.99 * _least_noise_norm(std, vector.numel()) - rounding
    if not added >= least:
        # not the norm added (follow-up, privacy 5): it may be a user's update's
        raise ValueError(
            f"add_noise returned an update without its noise share: what it added is far "
            f"smaller than N(0, {std:.6g}^2 I) over {vector.numel()} entries (below the "
            "chi-square's e^-50 quantile); it must return vector + noise of std noise_std "
            "drawn from generator"
        )


def _refuse_changed_update(vector: torch.Tensor, before: torch.Tensor, std: float) -> None:
    """Raise ``ValueError`` when a replacement ``add_noise`` changed the clipped update itself.

    Follow-up of the forty-seventh review of issue 15 (privacy 5; the forty-sixth review's api 1
    through ``add_noise``): a replacement returning ``10 * vector + noise`` (or the unclipped
    update plus noise) passed the share's size check: 10,000 entries, share std 0.5 C, the
    update sent held 9.8 C along its direction (norm 51 C with the share), which the server
    keeps in distributed mode (up to ``C + s (sqrt(d) + 10)``, 56 C): ten times the sensitivity
    epsilon is charged for. What was added along the clipped update's direction is, for a
    share of std ``s``, one normal draw ``N(0, s^2)``: beyond ``10 s`` (chance below e^-50)
    plus the sum's rounding, the update itself was scaled. A partial check: a scale of at most
    ``1 + 10 s / C`` (4 on the toy model at s = 0.3 C), or a change across the update's
    direction, passes.
    """
    base = before.detach().double()
    length = float(torch.linalg.vector_norm(base))
    if not length > 0.0:
        return
    along = float(torch.dot((vector.detach().double() - base).reshape(-1), base.reshape(-1)))
    unit = torch.finfo(vector.dtype).eps / 2.0
    rounding = 2.0 * unit * float(torch.linalg.vector_norm(vector.detach().double()))
    if not abs(along / length) <= 10.0 * std + rounding:
        # not how much (follow-up, privacy 5): it follows the user's update's norm
        raise ValueError(
            "add_noise changed the clipped update itself (beyond its noise share, along the "
            "update's direction): it must return vector + noise, the vector as it was given"
        )


def _refuse_unused_generator(generator: torch.Generator, state: torch.Tensor) -> None:
    """Raise ``ValueError`` when a replacement ``add_noise`` drew nothing from ``generator``.

    Follow-up of the forty-seventh review of issue 15 (privacy 4; api 1's twin): a replacement
    that drew its share elsewhere (``delta + std * torch.randn_like(delta)``, torch's global
    generator, or a generator of its own seeded with a constant) passed the share's size check
    but not its source: in secure mode the share is no longer drawn from the operating system's
    entropy, and a share of a constant seed (or of an app that seeds torch for reproducible
    training) is known to whoever knows the seed, who subtracts it from the update it reads.
    """
    if torch.equal(generator.get_state(), state):
        raise ValueError(
            "add_noise drew nothing from the generator it was given: the noise share must be "
            "drawn from generator (noise_generator's: keyed by round and user, or the operating "
            "system's entropy in secure mode), not from torch's global generator or one of its "
            "own"
        )


def _checked_clip(result: object, update: torch.Tensor, clip_norm: float | None) -> ClipResult:
    """A replacement ``clip``'s ``result``, checked: a plain tensor like ``update``, norm <= C.

    Forty-sixth review of issue 15 (api 1): a replacement ``clip`` (``privatize_update(...,
    clip=...)``, or :class:`~fedprivopt.clients.LocalTrainer` subclass overriding
    :meth:`~fedprivopt.clients.LocalTrainer.clip`, its documented extension point) was
    trusted: a per-layer clip to ``C`` each sent an update of norm ``1.41 C`` for two layers, a
    clip that forgot to scale sent norm ``10 C``. In distributed-noise mode the server cannot
    re-clip a noised share to ``C``: it keeps updates up to ``C + s (sqrt(d) + 10)`` (8.9 C for
    the toy model at sigma 1 and 4 shares), so such updates reached the sum above ``C`` under a
    charge of ``C``. Refused naming ``clip`` (the exact norm of ``clip_l2``'s result never
    exceeds ``C``; :func:`~fedprivopt.privacy.l2_norm` errs by at most ``norm_error_bound``).
    """
    parts = tuple(getattr(result, key, None) for key in ClipResult._fields)
    if not isinstance(result, tuple) or any(part is None for part in parts):
        raise ValueError(
            "clip must return a ClipResult (vector, norm, clipped), got a "
            f"{type(result).__name__}"  # not its values: a user's update (follow-up, privacy 5)
        )
    vector, norm, clipped = parts
    _refuse_other_tensor("clip", vector, update)
    if clip_norm is not None:
        measured = l2_norm(vector)
        if not measured <= clip_norm * (1.0 + norm_error_bound(vector.numel())):
            # not the norm it measured (follow-up, privacy 5): a user's update's, which left
            # a node of one's own in the error's text (Flower's error reply's reason)
            raise ValueError(
                f"clip returned an update of L2 norm above clip_norm {clip_norm:.6g}: the whole "
                "update must be clipped to L2 norm clip_norm (per-layer clip norms must "
                "together stay within it)"
            )
    return ClipResult(vector, norm, clipped)


def _shares_memory(vector: object, update: torch.Tensor) -> bool:
    """Whether ``vector`` (what is sent) is held in the memory of the caller's ``update``."""
    if not isinstance(vector, torch.Tensor) or vector.layout != torch.strided:
        return False
    if vector.device != update.device or vector.device.type == "meta":
        return False
    return vector.untyped_storage().data_ptr() == update.untyped_storage().data_ptr()


def noise_generator(
    *,
    seed: int | None,
    secure: bool,
    round_num: int,
    user_id: int,
    stream: str = "train",
    device: torch.device | str = "cpu",
) -> torch.Generator:
    """The generator of user ``user_id``'s noise share in round ``round_num``.

    Keyed by ``(seed, round_num, "client-noise", stream, user_id)`` (:class:`~fedprivopt.privacy.
    RngFactory`), so the share does not depend on call order and a seeded run is reproducible;
    in secure mode (``secure=True``, ``seed`` ignored) seeded from the operating system's
    entropy. ``seed``, ``secure``, ``round_num`` and ``stream`` are the train message's
    ``seed``, ``secure``, ``round`` and ``stream``.

    Parameters
    ----------
    seed : int or None
        The clients' seed the server sent (derived one-way from the run's root seed).
    secure : bool
        Draw from OS entropy instead (deployments).
    round_num : int
        Server round.
    user_id : int
        The user whose update is noised.
    stream : str
        The request's stream (ADADP trains a user twice a round, as ``"train"`` and another).
    device : torch.device or str
        Device of the update (a CUDA update needs a CUDA generator).

    Raises
    ------
    ValueError
        If ``secure`` is not a bool, ``round_num`` or ``user_id`` not an integer ``>= 0``
        (NumPy's integers are), or ``stream`` not a non-empty string.
    """
    # thirty-fourth review of issue 15 (tasks, finding 8): int() and str() took user 1.7, True
    # and "1" as user 1, round 1.9 as round 1 (the same noise for two keys) and a stream of
    # None as "None", and any true value (the string "false" too) as secure mode
    secure = check_bool("secure", secure)
    round_num = check_int("round_num", round_num, 0)
    user_id = check_int("user_id", user_id, 0)
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty string, got {shown(stream)}")
    rngs = RngFactory(seed=None, secure=True) if secure else RngFactory(seed=seed)
    return rngs.generator(round_num, NOISE_PURPOSE, stream, user_id, device=device)
