"""AdaDPS with side information no real deployment has: the synthetic generator's own tag words.

An upper-bound analysis for ``docs/EXPERIMENTS.md`` ("Where the claims do not reproduce"): if
AdaDPS cannot lead DP-FedAvg by 3 points even when its preconditioner knows which words carry
the tags, no public side information will make it do so on this data. The generator's
:class:`~fedprivopt.data.synthetic_model.WordTagModel` is rebuilt from the dataset's marker (the
same seed stream as :func:`fedprivopt.data.synthetic.generate`), and ``A`` is

- ``pair``: ``1/factor`` on the weight of (word, tag) where the word is one of the tag's
  informative words, 1 elsewhere (the bias included);
- ``row``: ``1/factor`` on the whole weight row of every informative word (of any tag), 1 on
  the other rows and the bias (the authors' two-level scaling, with the true split of the
  vocabulary in place of the top 100 by frequency);
- ``names``: ``1/factor`` on the rows of the words that are also published tag names (public:
  the tag list is published, and on StackOverflow tags are words, such as ``python``; the
  generator makes each tag's name its most frequent informative word, modelled on that).

Dividing by ``A`` multiplies those coordinates' gradients by ``factor``. The run is an ordinary
``adadps`` run of the preset (same sampling, clipping, noise and ε) with only ``A`` replaced.
``pair`` and ``row`` are not methods: the generator's tag words are not public.

Usage::

    python experiments/oracle_side_information.py --kind row --set noise-multiplier=1.0
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from unittest import mock

import tomllib
import torch

from fedprivopt.data.synthetic import word_tag_model
from fedprivopt.data.synthetic_config import SyntheticConfig
from fedprivopt.simulation import run as run_module
from fedprivopt.simulation.config import load_config


def _value(text: str) -> object:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def oracle_preconditioner(task, data_dir: Path, kind: str, factor: float) -> torch.Tensor:
    """``A`` of ``kind`` over the task's ``V K + K`` layout (word rows, then the bias)."""
    marker = json.loads((data_dir / "stackoverflow.synthetic.json").read_text())
    config = SyntheticConfig(**marker["config"])
    model = word_tag_model(config)
    word_index = {w: i for i, w in enumerate(task.words)}
    tag_index = {t: i for i, t in enumerate(task.tags)}
    v, k = len(task.words), len(task.tags)
    a = torch.ones(v * k + k, dtype=torch.float32)
    marked = set()
    if kind == "names":  # public: the words that are also published tag names
        for name in task.tags:
            if name in word_index:
                w = word_index[name]
                a[w * k : (w + 1) * k] = 1.0 / factor
                marked.add(w)
        print(json.dumps({"kind": kind, "marked": len(marked)}))
        return a
    for t, name in enumerate(model.tag_names):
        for word_id in model.tag_words[t]:
            w = word_index.get(model.words[word_id])
            if w is None:
                continue
            if kind == "row":
                a[w * k : (w + 1) * k] = 1.0 / factor
                marked.add(w)
            elif name in tag_index:
                a[w * k + tag_index[name]] = 1.0 / factor
                marked.add((w, tag_index[name]))
    print(json.dumps({"kind": kind, "marked": len(marked), "entries_below_1": int((a < 1).sum())}))
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the preset's ``adadps`` with the oracle ``A`` for each seed; print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="simulations/adadps-paper.toml")
    parser.add_argument("--kind", choices=("pair", "row", "names"), default="row")
    parser.add_argument("--factor", type=float, default=200.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    overrides = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    torch.set_num_threads(1)
    accuracy, loss = [], []
    for seed in args.seeds:
        config = load_config(args.preset, {"eval-every": 10**6, **overrides, "strategy": "adadps",
                                           "seed": seed, "side-information.kind": "ones",
                                           "clients-per-round": 20.0})  # fmt: skip
        data_dir = Path(config.task_params["data_dir"])

        def side(_resolved, task, _dir=data_dir):
            return oracle_preconditioner(task, _dir, args.kind, args.factor)

        with (
            tempfile.TemporaryDirectory() as tmp,
            mock.patch.object(run_module, "build_side_information", side),
        ):
            out = run_module.simulate(config, Path(tmp) / "run")
        accuracy.append(out.rows[-1]["eval_accuracy"])
        loss.append(out.rows[-1]["eval_loss"])
    print(json.dumps({
        "kind": args.kind, "factor": args.factor, "overrides": overrides, "seeds": args.seeds,
        "accuracy": [round(x, 4) for x in accuracy], "loss": [round(x, 3) for x in loss],
        "mean": round(statistics.mean(accuracy), 4),
        "std": round(statistics.stdev(accuracy), 4) if len(accuracy) > 1 else 0.0,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
