"""Benchmark N1: next-word prediction at the Reddi setting, cohort vs LocalTrainer (issue 19).

Reddi et al.'s StackOverflow next-word setting: 50 clients per round, vocabulary 10,000, an
embedding-LSTM-projection model with ``e = 96`` and ``h = 670`` (4,053,428 parameters), sentences
of at most 20 tokens, one local epoch of minibatches of 16, at most 1,000 examples per user
(TFF's ``max_elements_per_user``), on synthetic users of real size (``synth-user-sizes =
"real"``: at least 100 examples, mean 443).

Each round draws 50 users, and the cohort trainer (:class:`~fedprivopt.models.next_word_cohort.
NextWordCohortTrainer`, what the fast engine runs with ``vectorize = true``) computes their
clipped updates; the server's part of a round (summing 50 dense updates, one Adam step) is not
included. The sequential :class:`~fedprivopt.clients.LocalTrainer` trains a few of the first
round's users, whose updates are compared with the cohort's. Both are rated by the model's
matmul FLOPs over the real (non-pad) target tokens (:func:`~fedprivopt.models.next_word_cohort.
model_flops`: forward and backward), against the machine's dense float32 matmul FLOP/s (a
``4096 x 4096`` product) at torch's thread count, measured before and after the rounds (and at
one thread: the cohort trainer's steps run on one by default, ``cpu_threads``). Run by
``benchmarks/run.py`` (group ``nextword``), which imports it from its own directory.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.core.local import epoch_orders
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.next_word_cohort import model_flops
from fedprivopt.privacy import RngFactory

SETTING = dict(vocab_size=10_000, embedding_dim=96, hidden_size=670, seq_len=20)


def matmul_flops(
    device: str, size: int = 4096, repeat: int = 5, threads: int | None = None
) -> list[float]:
    """FLOP/s of ``repeat`` dense float32 ``size x size`` matmuls on ``device`` (one warm-up).

    ``threads``: torch's intra-op threads meanwhile (``None``: as set).
    """
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _matmuls(device, size, repeat)
    finally:
        torch.set_num_threads(before)


def _matmuls(device: str, size: int, repeat: int) -> list[float]:
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    out = []
    for i in range(repeat + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            out.append(2.0 * size**3 / (time.perf_counter() - start))
    return out


def _tokens(task, users, config: LocalConfig, rngs: RngFactory, round_num: int) -> int:
    """Non-pad targets the users train on this round (each counted once per epoch)."""
    total = 0
    for u in users:
        x, y = task.user_data(u)
        subset, _ = epoch_orders(
            int(x.shape[0]),
            epochs=config.epochs,
            max_examples=config.max_examples,
            generator=rngs.generator(round_num, "shuffle", "train", u),
        )
        total += config.epochs * int((y[subset] != 0).sum())
    return total


def bench_next_word(
    rounds: int = 2, clients: int = 50, seq_users: int = 3, device: str = "cpu", population=400
) -> dict:
    """Seconds per round and achieved matmul FLOP/s of the cohort trainer and of LocalTrainer."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        task = build_task(
            "stackoverflow-nwp", data_dir=tmp, synth_clients=population,
            synth_user_sizes="real", eval_users=1, **SETTING,
        )  # fmt: skip
        for u in range(task.num_users):
            task.user_data(u)  # read before the timed rounds (the engine's token store does too)
        data_seconds = time.perf_counter() - start
        w = initial_flat(task)
        config = LocalConfig(learning_rate=0.3, epochs=1, batch_size=16, clip_norm=1.0)
        rngs = RngFactory(seed=0)
        cohort = task.cohort_trainer(device=device)
        peak = matmul_flops(device)
        one = matmul_flops(device, threads=1) if device == "cpu" else []
        rows, first = [], None
        for r in range(1, rounds + 1):
            gen = torch.Generator().manual_seed(r)
            users = sorted(torch.randperm(task.num_users, generator=gen)[:clients].tolist())
            tokens = _tokens(task, users, config, rngs, r)
            start = time.perf_counter()
            updates = dict(cohort.train(w, users, round_num=r, config=config, rngs=rngs))
            seconds = time.perf_counter() - start
            flops = model_flops(tokens, task.vocab_size, task.embedding_dim, task.hidden_size)
            rows.append({"round": r, "seconds": seconds, "tokens": tokens, "flops": flops})
            print(f"N1 round {r}: {clients} users, {tokens:,} target tokens, {flops / 1e12:.2f} "
                  f"TFLOP in {seconds:.1f} s ({flops / seconds / 1e9:.1f} GFLOP/s)")  # fmt: skip
            if first is None:
                first = (users, updates)
        users, updates = first
        local = LocalTrainer(task, device=device)
        seq_tokens, seq_seconds, seq_one, diff = 0, 0.0, 0.0, 0.0
        threads = torch.get_num_threads()
        for u in users[:seq_users]:
            start = time.perf_counter()
            ref = local.train(w, user_id=u, round_num=1, config=config, rngs=rngs)
            seq_seconds += time.perf_counter() - start
            if device == "cpu":  # and on one thread, as the cohort's steps run
                torch.set_num_threads(1)
                start = time.perf_counter()
                local.train(w, user_id=u, round_num=1, config=config, rngs=rngs)
                seq_one += time.perf_counter() - start
                torch.set_num_threads(threads)
            seq_tokens += _tokens(task, [u], config, rngs, 1)
            diff = max(diff, float((ref.delta - updates[u]).abs().max()))
        peak += matmul_flops(device)
        one += matmul_flops(device, threads=1) if device == "cpu" else []
    seq_flops = model_flops(seq_tokens, task.vocab_size, task.embedding_dim, task.hidden_size)
    matmul = statistics.median(peak)
    cohort_rate = sum(r["flops"] for r in rows) / sum(r["seconds"] for r in rows)
    seq_rate = seq_flops / seq_seconds
    round_flops = statistics.mean(r["flops"] for r in rows)
    out = {
        "device": device,
        "threads": torch.get_num_threads(),
        "clients": clients,
        "population": task.num_users,
        "parameters": task.parameter_count(),
        "data_seconds": data_seconds,
        "rounds": rows,
        "seconds_per_round": statistics.mean(r["seconds"] for r in rows),
        "flops_per_round": round_flops,
        "matmul_flops": peak,
        "matmul_flops_median": matmul,
        "matmul_flops_one_thread": statistics.median(one) if one else None,
        "cohort_flops": cohort_rate,
        "cohort_share": cohort_rate / matmul,
        "sequential": {
            "users": len(users[:seq_users]),
            "seconds": seq_seconds,
            "flops": seq_flops,
            "rate": seq_rate,
            "share": seq_rate / matmul,
            "seconds_per_round_estimate": round_flops / seq_rate,
            "one_thread_rate": seq_flops / seq_one if seq_one else None,
        },
        "max_abs_update_diff": diff,
    }
    if one:
        print(f"N1 matmul at one thread {statistics.median(one) / 1e9:.1f} GFLOP/s")
    print(f"N1 matmul {matmul / 1e9:.1f} GFLOP/s (median of {len(peak)}); cohort "
          f"{cohort_rate / 1e9:.1f} GFLOP/s ({100 * out['cohort_share']:.1f}%), LocalTrainer "
          f"{seq_rate / 1e9:.1f} GFLOP/s ({100 * out['sequential']['share']:.1f}%; one thread "
          f"{(seq_flops / seq_one if seq_one else 0) / 1e9:.1f}); "
          f"max |update difference| {diff:.1e}")  # fmt: skip
    return out


def next_word_lines(block: dict) -> list[str]:
    """The RESULTS.md section of an N1 block."""
    s = block["sequential"]
    single = block.get("matmul_flops_one_thread")
    one = f"; one thread: {single / 1e9:.1f} GFLOP/s" if single else ""
    lines = [
        "",
        f"## N1: next-word prediction at the Reddi setting ({block['device']}, "
        f"{block['threads']} threads)",
        "",
        f"{block['clients']} clients per round from {block['population']} real-size synthetic "
        f"users, vocabulary 10,000, LSTM 670 ({block['parameters']:,} parameters), batch 16, one "
        f"epoch, at most 1,000 examples a user; client training only. Code: "
        f"{block.get('code', 'not recorded')}.",
        "",
        "| trainer | s/round | TFLOP/round | GFLOP/s | share of matmul FLOP/s |",
        "|---|---:|---:|---:|---:|",
        f"| cohort (vectorize = true) | {block['seconds_per_round']:.1f} | "
        f"{block['flops_per_round'] / 1e12:.2f} | {block['cohort_flops'] / 1e9:.1f} | "
        f"{100 * block['cohort_share']:.1f}% |",
        f"| LocalTrainer ({s['users']} users, round estimated) | "
        f"{s['seconds_per_round_estimate']:.1f} | {block['flops_per_round'] / 1e12:.2f} | "
        f"{s['rate'] / 1e9:.1f} | {100 * s['share']:.1f}% |",
    ]
    if s.get("one_thread_rate"):
        r = s["one_thread_rate"]
        lines.append(
            f"| LocalTrainer, one thread | {block['flops_per_round'] / r:.1f} | "
            f"{block['flops_per_round'] / 1e12:.2f} | {r / 1e9:.1f} | "
            f"{100 * r / block['matmul_flops_median']:.1f}% |"
        )
    lines += [
        "",
        f"Dense float32 matmul: {block['matmul_flops_median'] / 1e9:.1f} GFLOP/s (median of "
        f"{len(block['matmul_flops'])}, before and after the rounds){one}. Largest difference "
        f"between the two trainers' updates: {block['max_abs_update_diff']:.1e}.",
    ]
    return lines
