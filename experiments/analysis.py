"""Signal against noise in the adaptive strategies' preconditioners, from finished runs.

For a run directory of ``dp2``, ``dp2-noise-first`` or ``dp-fedadam-bc`` this prints what the
strategy's second-moment estimate looks like next to what the noise alone would give, and (with
``--clean DIR``, the same strategy run with a negligible noise multiplier, e.g. 1e-6, and another
seed, so that it does not share the noise draws) how well the noisy estimate tracks the clean one:

- ``phi``: the per-coordinate noise variance of Δ̃, ``(σC/m̄)²``;
- DP2: ``v`` after the last switch against the noise-only expectation ``(1-β^n) Φ/s1`` (``n``
  switches), the quantiles of ``P = √v + ε``, the fraction of coordinates above 4× the noise
  level, and the share of the clean run's top 1% of ``v`` that is in the noisy top 1% (0.01 by
  chance);
- DP-AdamBC: the quantiles of ``v̂ - Φ̂`` in units of ``Φ``, the floored fraction, and the same
  top-1% overlap of ``v̂ - Φ̂`` with the clean run's ``v̂``.

Usage::

    python experiments/analysis.py runs/x/dp2 --clean runs/x/dp2-clean
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _load(run: Path) -> tuple[dict, dict]:
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    summary = json.loads((run / "summary.json").read_text())
    return ckpt["algorithm"], summary["config"]


def _quantiles(x: torch.Tensor, qs=(0.01, 0.1, 0.5, 0.9, 0.99)) -> dict[str, float]:
    sample = x.flatten()
    if sample.numel() > 2_000_000:
        idx = torch.randperm(sample.numel(), generator=torch.Generator().manual_seed(0))
        sample = sample[idx[:2_000_000]]
    values = torch.quantile(sample.double(), torch.tensor(qs, dtype=torch.float64))
    return {f"q{int(q * 100)}": float(v) for q, v in zip(qs, values, strict=True)}


def _top_overlap(noisy: torch.Tensor, clean: torch.Tensor, share: float = 0.01) -> float:
    """Fraction of the clean top ``share`` of coordinates that are in the noisy top ``share``.

    ``share`` itself when the noisy ranking is unrelated to the clean one, 1 when they agree.
    """
    k = max(1, int(share * noisy.numel()))
    top_noisy = torch.zeros(noisy.numel(), dtype=torch.bool)
    top_noisy[torch.topk(noisy.flatten().double(), k).indices] = True
    return float(top_noisy[torch.topk(clean.flatten().double(), k).indices].double().mean())


def _phi(config: dict) -> float:
    return (config["noise-multiplier"] * config["clip-norm"] / config["clients-per-round"]) ** 2


def analyse(run: Path, clean: Path | None) -> dict:
    """Return the statistics described in the module docstring."""
    alg, config = _load(run)
    state, phi = alg["opt_state"], _phi(config)
    out: dict = {
        "run": str(run),
        "strategy": config["strategy"],
        "phi": phi,
        "dim": int(alg["params"].numel()),
    }
    ref = _load(clean)[0]["opt_state"] if clean else None
    if config["strategy"].startswith("dp2"):
        s1, beta = config.get("dp2-s1", 5), config.get("dp2-beta", 0.9)
        rounds = alg["round"]
        cycles = rounds // (s1 + config.get("dp2-s2", 5)) + (
            rounds % (s1 + config.get("dp2-s2", 5)) >= s1
        )
        v = state["second_moment"]
        noise_v = (1 - beta**cycles) * phi / s1
        out |= {
            "switches": int(cycles),
            "noise_only_v": noise_v,
            "mean_v_over_noise": float(v.mean()) / noise_v if noise_v else float("nan"),
            "frac_v_above_4x_noise": float((v > 4 * noise_v).double().mean()),
            "P": _quantiles(state["preconditioner"]),
        }
        if ref is not None:
            out["top1pct_overlap_with_clean"] = _top_overlap(
                state["second_moment"], ref["second_moment"]
            )
            clean_v = ref["second_moment"]
            out["clean_signal_energy"] = float(clean_v.sum())
            out["noise_energy"] = noise_v * v.numel()
    elif config["strategy"] == "dp-fedadam-bc":
        b2 = config.get("beta2", 0.99)
        bc2 = 1 - b2 ** state["count"]
        corrected = (state["nu"] - state["noise_ema"]) / bc2
        out |= {
            "v_hat_minus_phi_over_phi": _quantiles(corrected / phi),
            "frac_above_phi": float((corrected > phi).double().mean()),
            "floor_fraction": state["floor_fraction"],
        }
        if ref is not None:
            clean = ref["nu"] / (1 - b2 ** ref["count"])
            out["top1pct_overlap_with_clean"] = _top_overlap(corrected, clean)
            out["clean_signal_energy"] = float(clean.sum())
            out["noise_energy"] = phi * corrected.numel()
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the analysis of each run as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--clean", type=Path, help="the same strategy with negligible noise")
    args = parser.parse_args(argv)
    print(json.dumps(analyse(args.run, args.clean), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
