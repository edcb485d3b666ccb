"""How much of a tag model's accuracy the noise on its bias decides, from one fresh run.

Runs ``simulations/adadps-paper.toml`` once (any strategy, ``--set key=value`` overrides, one
seed), keeps the final checkpoint, and evaluates the model the run reports three ways:

- ``as-is``: the reported model (the moving average of the iterates under the preset);
- ``bias=prior``: the same weights with the bias put back to the public log tag prior;
- ``W=0``: the learned bias alone (the weights zeroed).

It also prints the standard deviation of the bias' distance from the prior (nats). If
``bias=prior`` is far above ``as-is``, the words learned something that the noise on the bias
hides: with a trained bias the noise picks which tag a document without strong words gets
(``docs/EXPERIMENTS.md``, "The bias").

Usage::

    python experiments/bias_noise.py dp-fedavg --seed 0 --set server-learning-rate=3.0
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import tomllib
import torch

from fedprivopt.privacy.flat import flatten, unflatten
from fedprivopt.simulation.checkpoint import load_checkpoint
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import build_run, simulate


def _value(text: str) -> object:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    """Run, then print one JSON line of the three evaluations."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("strategy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="simulations/adadps-paper.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    overrides = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    torch.set_num_threads(1)
    config = load_config(
        args.preset,
        {**overrides, "strategy": args.strategy, "seed": args.seed, "checkpoint-every": 10**6},
    )
    with tempfile.TemporaryDirectory() as tmp:
        simulate(config, Path(tmp) / "run")
        state = load_checkpoint(Path(tmp) / "run")["algorithm"]
    task, _ = build_run(config)
    flat = state.get("averaged", state["params"])
    model = task.build_model()
    spec = flatten(model.state_dict())[1]

    def evaluate(parts: dict[str, torch.Tensor]) -> dict[str, float]:
        model.load_state_dict(parts)
        metrics = task.evaluate(model)
        return {"accuracy": round(metrics["accuracy"], 4), "loss": round(metrics["loss"], 3)}

    learned = unflatten(flat, spec)
    prior = task.log_tag_prior().to(learned["bias"].dtype)
    result = {
        "strategy": args.strategy,
        "seed": args.seed,
        "overrides": overrides,
        "as-is": evaluate(learned),
        "bias=prior": evaluate({**learned, "bias": prior}),
        "W=0": evaluate({**learned, "weight": torch.zeros_like(learned["weight"])}),
        "bias_minus_prior_std": round(float((learned["bias"] - prior).std()), 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
