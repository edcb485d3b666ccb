"""Explicit random generators for everything on the privacy path.

Every random draw that matters for privacy (cohort sampling, noise) comes from a ``torch.Generator``
made here, never from a global generator. A generator is identified by ``(seed, round, purpose)``:
the same triple always gives the same stream, so results do not depend on call order and two engines
that draw the same quantities produce the same numbers. In *secure* mode every generator is seeded
from the operating system's entropy instead, so the noise cannot be predicted from any seed, and
the generators are :class:`SecureGenerator` objects, which tell
:func:`~fedprivopt.privacy.noise.gaussian_noise` to use its floating-point hardened sampler.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import torch

from fedprivopt.core.checks import check_bool, check_int
from fedprivopt.core.devices import check_device

__all__ = ["RngFactory", "SecureGenerator", "check_rngs", "derive_seed"]

_MAX_SEED = 2**63 - 1


def derive_seed(seed: int, *keys: int | str) -> int:
    """Derive a 63-bit seed from a root seed and a sequence of keys.

    The derivation hashes a canonical text form with BLAKE2b, so nearby inputs (round 1 and round 2,
    ``"noise"`` and ``"sampling"``) give unrelated seeds.

    Parameters
    ----------
    seed : int
        Root seed, a non-negative integer.
    *keys : int or str
        Further identifiers, e.g. the round number and a purpose string.

    Returns
    -------
    int
        A seed in ``[0, 2**63 - 1]``.
    """
    seed = check_int("seed", seed, 0)
    text = "\x1f".join([str(seed), *(f"{type(k).__name__}:{k}" for k in keys)])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MAX_SEED


class SecureGenerator(torch.Generator):
    """A ``torch.Generator`` seeded from OS entropy by a secure-mode :class:`RngFactory`.

    It draws exactly like a plain generator (same algorithm: Mersenne Twister on CPU, Philox on
    CUDA); the type only marks the stream as secure-mode, so that
    :func:`~fedprivopt.privacy.noise.gaussian_noise` samples with the hardened method (sum of four
    draws, Holohan & Braghin 2021) instead of one draw.
    """


@dataclass(frozen=True)
class RngFactory:
    """Factory of ``torch.Generator`` objects keyed by ``(round, purpose)``.

    Parameters
    ----------
    seed : int or None
        Root seed for reproducible research. Must be ``None`` in secure mode.
    secure : bool
        If true, every generator is a :class:`SecureGenerator` seeded from ``secrets.randbits``
        (63 bits of the operating system's entropy per stream) and streams cannot be reproduced;
        Gaussian noise is then drawn with the floating-point hardened sampler of
        :mod:`fedprivopt.privacy.noise`. Use this for deployments whose noise must not be
        predictable. The generator algorithm itself is torch's (not a cryptographic PRNG).

    Examples
    --------
    >>> rngs = RngFactory(seed=7)
    >>> g = rngs.generator(3, "noise")
    >>> torch.randn(2, generator=g).shape
    torch.Size([2])
    """

    seed: int | None = 0
    secure: bool = False

    def __post_init__(self) -> None:
        check_bool("secure", self.secure)  # a tensor raised torch's RuntimeError (API review)
        if self.secure:
            if self.seed is not None:
                raise ValueError(
                    "seed must be None in secure mode (generators are then seeded from OS entropy)"
                )
        elif self.seed is None:
            raise ValueError("seed must be a non-negative integer unless secure=True")
        else:
            derive_seed(self.seed)  # validates

    def seed_for(self, round_num: int, purpose: str, *extra: int | str) -> int:
        """Return the 63-bit seed of the stream ``(round_num, purpose, *extra)``.

        In secure mode a fresh seed is drawn from the operating system on every call.
        """
        # a short API review of issue 15: inf raised OverflowError, NaN a ValueError naming
        # nothing, and 1.5 or True gave round 1's stream
        round_num = check_int("round_num", round_num, 0)
        if not isinstance(purpose, str):  # None, [1] or 1.5 were keyed as their text
            raise ValueError(f"purpose must be a str, got {type(purpose).__name__}")
        if self.secure:
            return secrets.randbits(63)
        return derive_seed(int(self.seed or 0), round_num, str(purpose), *extra)

    def generator(
        self,
        round_num: int,
        purpose: str,
        *extra: int | str,
        device: torch.device | str = "cpu",
    ) -> torch.Generator:
        """Return a fresh generator for ``(round_num, purpose, *extra)`` on ``device``.

        Parameters
        ----------
        round_num : int
            Server round (or any integer step counter).
        purpose : str
            What the draws are for, e.g. ``"noise"``, ``"sampling"``, ``"client-noise"``.
        *extra : int or str
            Further keys, e.g. a client id.
        device : torch.device or str
            Device of the generator; draws on CUDA need a CUDA generator. The same seed gives
            different streams on different device types.
        """
        kind = SecureGenerator if self.secure else torch.Generator
        gen = kind(device=check_device(device))
        gen.manual_seed(self.seed_for(round_num, purpose, *extra))
        if self.secure and gen.device.type == "cpu":
            _fill_from_entropy(gen)
        return gen


_MT_WORDS = 624  # the Mersenne Twister's state: 624 words of 32 bits
_MT_OFFSET = 24  # bytes before them in torch's CPU generator state (seed, left, seeded, next)


def _fill_from_entropy(gen: torch.Generator) -> None:
    """Give a CPU generator a Mersenne Twister state of 624 words of the OS's entropy.

    Forty-seventh review of issue 15 (contract 2): torch's CPU generator keeps the low 32 bits
    of ``manual_seed``'s seed (``mt19937(uint64_t seed)`` initializes from a ``uint32``), so a
    secure stream seeded with 63 bits of entropy was one of 2^32 streams: a search over them
    (5,290 a second in Python, 16 entries of the mean enough to test one) found round 1's server
    noise from the released models alone and gave its exact clipped sum (to 1.8e-7). The state
    (``get_state()``: the seed, ``left``, ``seeded``, ``next``, then the 624 words as 64-bit
    integers) is checked against the seed's own initialization before its words are replaced.
    """
    state = gen.get_state()
    words = state[_MT_OFFSET : _MT_OFFSET + 8 * _MT_WORDS].view(torch.int64)
    if state.numel() < _MT_OFFSET + 8 * _MT_WORDS or int(words[0]) != gen.initial_seed() % 2**32:
        raise RuntimeError(
            "secure mode: this torch's CPU generator state is not the layout fedprivopt fills "
            "from the OS's entropy (a seed alone gives 2^32 streams on the CPU); use the torch "
            "version of pyproject.toml"
        )
    fresh = [secrets.randbits(32) for _ in range(_MT_WORDS)]
    fresh[0] |= 0x80000000  # never the all-zero state (as the reference init_by_array does)
    state[_MT_OFFSET : _MT_OFFSET + 8 * _MT_WORDS] = torch.tensor(fresh, dtype=torch.int64).view(
        torch.uint8
    )
    gen.set_state(state)


def check_rngs(rngs: object) -> RngFactory:
    """``rngs`` if it is an :class:`RngFactory`; ``ValueError`` naming it otherwise.

    Forty-seventh review of issue 15 (mechanisms 4): ``TreeNoise(..., rngs=None)``,
    ``TreeCohorts`` and the samplers (``PoissonSampler(10, 0.5, None)``) were built, and their
    first draw ended in ``AttributeError: 'NoneType' object has no attribute 'generator'``.
    """
    if not isinstance(rngs, RngFactory):
        raise ValueError(
            f"rngs must be an RngFactory (RngFactory(seed=...) or RngFactory(seed=None, "
            f"secure=True)), got {type(rngs).__name__}"
        )
    return rngs
