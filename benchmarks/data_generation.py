"""Benchmark D1: synthetic StackOverflow generation throughput (issue 19).

Generates the same real-size dataset (``--user-sizes real``: at least 100 examples a user, mean
443) with one worker and with every CPU, checks that the files are byte-identical and reports
examples per second. Run by ``benchmarks/run.py`` (group ``data``), which imports it from its
own directory: a dependency installs a top-level ``benchmarks`` package.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

from fedprivopt.data.sqlite import read_example_counts
from fedprivopt.data.synthetic import default_workers, generate
from fedprivopt.data.synthetic_config import SyntheticConfig


def _digest(files) -> str:
    h = hashlib.sha256()
    for path in (files.sqlite, files.word_count, files.tag_count):
        h.update(path.read_bytes())
    return h.hexdigest()


def bench_data_generation(clients: int = 4096) -> dict:
    """Seconds and examples/s of :func:`generate` at 1 worker and at every CPU."""
    config = SyntheticConfig.sized("real", num_clients=clients)
    rows, digests = [], set()
    for workers in sorted({1, default_workers()}):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            files = generate(Path(tmp) / "so", config, workers=workers)
            seconds = time.perf_counter() - start
            examples = sum(int(c.sum()) for c in read_example_counts(files.sqlite).values())
            digests.add(_digest(files))
        rows.append(
            {"workers": workers, "seconds": seconds, "examples": examples,
             "examples_per_second": examples / seconds}
        )  # fmt: skip
        print(f"D1 {clients} real-size users, {workers} worker(s): {examples:,} examples in "
              f"{seconds:.1f} s ({examples / seconds:,.0f}/s)")  # fmt: skip
    return {"device": "cpu", "clients": clients, "rows": rows, "identical": len(digests) == 1}


def data_lines(block: dict) -> list[str]:
    """The RESULTS.md section of a D1 block."""
    lines = [
        "",
        f"## D1: synthetic data generation ({block['clients']:,} real-size users)",
        "",
        "`fedprivopt data synth --user-sizes real` (at least 100 examples a user, mean 443: the "
        "real splits' published sizes). Files byte-identical for every number of workers: "
        f"{'yes' if block['identical'] else 'NO'}. Code: {block.get('code', 'not recorded')}.",
        "",
        "| workers | examples | seconds | examples/s |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['workers']} | {r['examples']:,} | {r['seconds']:.1f} | "
        f"{r['examples_per_second']:,.0f} |"
        for r in block["rows"]
    ]
    return lines
