"""Issue 15, forty-seventh hostile review (contract: the privacy contract measured on real runs).

1. ``examples/flower-app`` (a user's own ServerApp, docs/FLOWER.md) built its model with
   ``build_model(config.seed)``, which seeds torch's generator with the run's root seed. Torch's
   CPU generator keeps the seed's low 32 bits, so round 1's model, sent to every client, gave
   the root seed back by a search over seeds (seed 3141593 found at about 9,000 tries a second
   in Python; the models of seeds s and s + 2**32 are the same), and with the seed every round's
   server noise: round 1's clipped sum came back to 3.6e-7 (dp-fedavg, sigma 0.7, 20 a round).
   Now the model is built from ``derive_seed(seed, "initial-model")``, one-way.
2. Secure mode (``secure = true``): every stream was a CPU generator given
   ``manual_seed(secrets.randbits(63))``, but torch's CPU generator keeps the seed's low 32
   bits, so each stream was one of 2^32. A search over them (5,290 a second in Python; 16
   entries of the released mean test a candidate) found a secure dp-fedavg round's server noise
   from the released models alone and gave its exact clipped sum (max error 1.8e-7, noise std
   0.5). Now ``RngFactory.generator`` fills a secure CPU generator's 624-word Mersenne Twister
   state from the OS's entropy (``privacy.rng._fill_from_entropy``).
"""

from __future__ import annotations

import types
from pathlib import Path

import tomllib
import torch
from flwr.app import ArrayRecord

from fedprivopt.privacy.noise import gaussian_noise
from fedprivopt.privacy.rng import RngFactory, derive_seed
from fedprivopt.strategies.flower import arrays_to_flat

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"


def _initial_flat(monkeypatch, seed: int) -> torch.Tensor:
    """The model the example's ServerApp starts round 1 from (what every client receives)."""
    monkeypatch.syspath_prepend(str(APP))
    from flower_app import server_app

    captured = {}

    class Stub:
        def __init__(self, algorithm, spec, on_round=None):
            captured["algorithm"] = algorithm

        def start(self, grid, initial, **kwargs):
            captured["initial"] = initial

    monkeypatch.setattr(server_app, "DPStrategy", Stub)
    with (APP / "pyproject.toml").open("rb") as f:
        run_config = dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])
    run_config.update({"seed": seed, "metrics-file": ""})
    server_app.main(None, types.SimpleNamespace(run_config=run_config))
    return arrays_to_flat(captured["initial"])[0]


def test_1_example_app_initial_model_does_not_carry_the_root_seed(monkeypatch):
    seed = 3_141_593
    first = _initial_flat(monkeypatch, seed)
    from flower_app.task import build_model  # the example's, on the path now

    # torch.manual_seed(seed)'s model: a search over seeds finds the seed from it
    seeded = arrays_to_flat(ArrayRecord(build_model(seed).state_dict()))[0]
    assert not torch.equal(first, seeded)
    # a function of the whole seed, not of its low 32 bits
    assert not torch.equal(first, _initial_flat(monkeypatch, seed + 2**32))
    assert torch.equal(first, _initial_flat(monkeypatch, seed))  # still reproducible


def test_2_secure_stream_is_not_one_of_2_32_seeds():
    gen = RngFactory(seed=None, secure=True).generator(1, "server-noise", "")
    drawn = gaussian_noise(16, 0.5, generator=gen, dtype=torch.float32)
    for seed in (gen.initial_seed(), gen.initial_seed() % 2**32):  # what a search would try
        other = type(gen)()
        other.manual_seed(seed)
        assert not torch.equal(drawn, gaussian_noise(16, 0.5, generator=other, dtype=torch.float32))
    again = RngFactory(seed=None, secure=True).generator(1, "server-noise", "")
    assert not torch.equal(drawn, gaussian_noise(16, 0.5, generator=again, dtype=torch.float32))
    # seeded streams are unchanged (reproducible runs keep their numbers)
    seeded = RngFactory(seed=7).generator(1, "server-noise", "")
    plain = torch.Generator().manual_seed(derive_seed(7, 1, "server-noise", ""))
    assert torch.equal(torch.rand(8, generator=seeded), torch.rand(8, generator=plain))
