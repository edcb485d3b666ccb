"""The simulation run loop: engines, metrics files, checkpoints and resume.

A run directory holds

- ``config.toml``: the resolved configuration (what ``--resume`` reads back);
- ``metrics.jsonl``: one JSON object per evaluated round (``round``, ``epsilon``, ``delta``,
  ``eval_*`` task metrics, ``cohort_size``, ``seconds`` and the round's mechanism metrics);
- ``summary.json``: strategy, rounds completed, final metrics, ε, δ, why the run stopped;
- ``checkpoint.pt`` (and the previous one, ``checkpoint.prev.pt``): the server state after the
  last checkpointed round, written atomically (temporary file, fsync, rename).

Both engines drive the same :class:`~fedprivopt.strategies.ServerAlgorithm`: ``fast`` in process
with :class:`~fedprivopt.clients.LocalTrainer`, ``flower`` through Flower's simulation engine (Ray)
with :class:`~fedprivopt.strategies.flower.DPStrategy`. All randomness is keyed by (seed, round,
user), so a resumed run ends with the same model and ε as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedprivopt.clients.trainer import LocalConfig, LocalTrainer
from fedprivopt.models import build_task
from fedprivopt.models.task import Task, initial_flat, model_spec
from fedprivopt.privacy.flat import unflatten
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.strategies.algorithms import build_algorithm
from fedprivopt.strategies.core import RoundResult, ServerAlgorithm, TrainRequest, drive_round

__all__ = [
    "RunOutcome",
    "RunWriter",
    "build_run",
    "prepare_run_dir",
    "resume",
    "serve_flower",
    "simulate",
]

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT = "checkpoint.pt"
PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"


@dataclass
class RunOutcome:
    """What :func:`simulate` returns."""

    out_dir: Path
    params: torch.Tensor
    epsilon: float
    rounds_completed: int
    stopped_reason: str
    rows: list[dict[str, Any]]


# -- files -----------------------------------------------------------------------------------------


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return json.dumps(str(value))


def config_to_toml(config: RunConfig) -> str:
    """The resolved configuration as a preset (loadable by :func:`load_config`)."""
    data = config.to_mapping()
    params = data.pop("task-params")
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items()]
    lines += ["", "[task-params]"] + [f"{k} = {_toml_value(v)}" for k, v in params.items()]
    return "\n".join(lines) + "\n"


def _json_line(row: dict[str, Any]) -> str:
    return json.dumps(row, allow_nan=True) + "\n"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl``; an incomplete last line (a killed write) is dropped."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return rows


def prepare_run_dir(out_dir: str | Path, config: RunConfig, *, overwrite: bool = False) -> Path:
    """Create ``out_dir`` and write ``config.toml``; refuse to overwrite an existing run."""
    out = Path(out_dir)
    if (out / CONFIG_FILE).exists() and not overwrite:
        raise ValueError(
            f"out directory {str(out)!r} already holds a run (use --resume {out} to continue it, "
            "or choose another --out)"
        )
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(out / CONFIG_FILE, config_to_toml(config).encode())
    for name in (METRICS_FILE, SUMMARY_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT):
        (out / name).unlink(missing_ok=True)
    return out


class RunWriter:
    """Writes rows, checkpoints and the summary of one run directory."""

    def __init__(self, out: Path, config: RunConfig, algorithm: ServerAlgorithm, task: Task):
        self.out = out
        self.config = config
        self.algorithm = algorithm
        self.task = task
        self.rows = read_rows(out / METRICS_FILE)
        self.last_time = time.perf_counter()
        self.progress: Callable[[dict[str, Any]], None] | None = None

    def save_checkpoint(self) -> None:
        """Atomically replace the checkpoint, keeping the previous one."""
        import io

        buf = io.BytesIO()
        torch.save({"algorithm": self.algorithm.state_dict(), "rows": len(self.rows)}, buf)
        ckpt = self.out / CHECKPOINT
        if ckpt.exists():
            os.replace(ckpt, self.out / PREVIOUS_CHECKPOINT)
        _atomic_write_bytes(ckpt, buf.getvalue())

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Central evaluation of ``params`` on the task's held-out data."""
        model = self.task.build_model()
        model.load_state_dict(unflatten(params.detach().cpu(), model_spec(self.task)))
        return {f"eval_{k}": float(v) for k, v in self.task.evaluate(model).items()}

    def wants_eval(self, round_num: int) -> bool:
        """Whether ``round_num`` is evaluated (every ``eval-every`` rounds and the last)."""
        c = self.config
        return round_num % c.eval_every == 0 or round_num == c.strategy.num_server_rounds

    def on_round(self, result: RoundResult, eval_metrics: dict[str, float] | None) -> None:
        """Record one finished round: a metrics row if evaluated, a checkpoint if due."""
        now = time.perf_counter()
        seconds, self.last_time = now - self.last_time, now
        r = result.round_num
        if eval_metrics is not None:
            row = {
                "round": r,
                "epsilon": result.metrics["epsilon"],
                "delta": self.config.strategy.delta,
                **eval_metrics,
                "seconds": seconds,
                **{k: v for k, v in result.metrics.items() if k != "epsilon"},
            }
            self.rows.append(row)
            with open(self.out / METRICS_FILE, "a") as fh:
                fh.write(_json_line(row))
                fh.flush()
                os.fsync(fh.fileno())
            if self.progress is not None:
                self.progress(row)
        if r % self.config.checkpoint_every == 0 or r == self.config.strategy.num_server_rounds:
            self.save_checkpoint()

    def write_summary(self, stopped_reason: str) -> dict[str, Any]:
        """Write ``summary.json`` for the run as it stands."""
        c = self.config
        final = {
            k: v for k, v in (self.rows[-1] if self.rows else {}).items() if k.startswith("eval_")
        }
        summary = {
            "strategy": c.strategy.strategy,
            "engine": c.engine,
            "task": c.task,
            "seed": c.strategy.seed,
            "noise_multiplier": c.strategy.noise_multiplier if c.strategy.private else 0.0,
            "rounds_completed": self.algorithm.round_num,
            "epsilon": self.algorithm.epsilon(),
            "delta": c.strategy.delta,
            "accountant": c.strategy.accountant,
            "stopped_reason": stopped_reason,
            "final": final,
            "noise_mode": c.strategy.noise_mode if c.strategy.private else "none",
            "threat_model": _threat_model(c),
            "config": c.to_mapping(),
        }
        _atomic_write_bytes(
            self.out / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=True).encode()
        )
        return summary


def _threat_model(config: RunConfig) -> str:
    s = config.strategy
    if not s.private:
        return "not private: updates are neither clipped nor noised"
    text = "user-level DP of every released model (and of everything computed from them)"
    if s.noise_mode == "server":
        text += "; the server is trusted with individual clipped updates"
    else:
        text += (
            "; each update leaves its device carrying a noise share, and the full guarantee "
            "needs min-shares honest shares (the server tops up when fewer arrive)"
        )
    if s.strategy == "adadps":
        text += "; the side information must be public: it is not covered by the guarantee"
    return text


# -- building blocks -------------------------------------------------------------------------------


def build_run(config: RunConfig) -> tuple[Task, ServerAlgorithm]:
    """Build the task and the server algorithm; raises ``ValueError`` on inconsistent settings."""
    task = build_task(config.task, **config.task_params)
    if task.num_users != config.strategy.population:
        raise ValueError(
            f"population must equal the number of users of task {config.task!r} "
            f"({task.num_users}), got {config.strategy.population}"
        )
    init = initial_flat(task)
    side = None
    if config.strategy.strategy == "adadps":
        make = getattr(task, "side_information", None)
        if config.side_information == "auto" and callable(make):
            side = make()
        else:
            side = torch.ones_like(init)
    return task, build_algorithm(config.strategy, init, preconditioner=side)


def _local_config(cfg: dict[str, Any]) -> LocalConfig:
    return LocalConfig(
        learning_rate=cfg["local-learning-rate"],
        epochs=cfg["local-epochs"],
        batch_size=cfg["batch-size"],
        max_examples=cfg["max-examples"] or None,
        clip_norm=cfg["clip-norm"] or None,
        noise_std=cfg["noise-std"],
    )


def fast_train(trainer: LocalTrainer, secure: bool) -> Callable[[TrainRequest], dict]:
    """The fast engine's client side: train every requested user in process."""

    def train(request: TrainRequest) -> dict[int, torch.Tensor]:
        cfg = request.client_config
        local = _local_config(cfg)
        rngs = RngFactory(seed=None, secure=True) if secure else RngFactory(seed=cfg["seed"])
        return {
            u: trainer.train(
                request.params,
                user_id=u,
                round_num=request.round_num,
                config=local,
                rngs=rngs,
                preconditioner=request.preconditioner,
                stream=request.stream,
            ).delta
            for u in request.users
        }

    return train


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


SMALL_MODEL = 200_000  # parameters below which one CPU thread beats several (op overhead)


def _run_fast(config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter) -> str:
    trainer = LocalTrainer(task, device=_device(config.device))
    train = fast_train(trainer, config.strategy.secure)
    threads = torch.get_num_threads()
    if alg.params.numel() < SMALL_MODEL:
        # measured on 2 cores: 5.7 ms per toy user with 1 thread, 45 ms with 2 (contention)
        torch.set_num_threads(1)
    try:
        for r in range(alg.round_num + 1, config.strategy.num_server_rounds + 1):
            if not alg.budget_allows_next_round():
                return "budget"
            result = drive_round(alg, r, train)
            metrics = writer.evaluate(result.params) if writer.wants_eval(r) else None
            writer.on_round(result, metrics)
        return "rounds"
    finally:
        torch.set_num_threads(threads)


def serve_flower(
    grid,
    config: RunConfig,
    task: Task,
    alg: ServerAlgorithm,
    writer: RunWriter,
    *,
    min_nodes: int = 1,
) -> str:
    """Run the rounds of ``alg`` through a Flower ``grid`` (inside a ServerApp's main).

    Used by the simulation engine and by the deployment ServerApp. Central evaluation follows
    ``eval-every``; every round reaches ``writer``. Returns why the run stopped.
    """
    from flwr.app import MetricRecord

    from fedprivopt.strategies.flower import DPStrategy, flat_to_arrays

    spec = model_spec(task)

    def evaluate_fn(server_round: int, arrays) -> MetricRecord | None:
        if server_round == 0 or not writer.wants_eval(server_round):
            return None
        model = task.build_model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({f"eval_{k}": float(v) for k, v in task.evaluate(model).items()})

    strategy = DPStrategy(alg, spec, min_nodes=min_nodes, on_round=writer.on_round)
    writer.last_time = time.perf_counter()
    strategy.start(
        grid,
        flat_to_arrays(alg.params, spec),
        num_rounds=config.strategy.num_server_rounds,
        evaluate_fn=evaluate_fn,
    )
    return alg.stopped_reason or "rounds"


def _run_flower(config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter) -> str:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedprivopt.clients.client_app import make_client_app

    app = ServerApp()
    done: list[str] = []

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        done.append(serve_flower(grid, config, task, alg, writer))

    backend = {
        "client_resources": {"num_cpus": config.client_cpus, "num_gpus": config.client_gpus},
        "init_args": {"num_cpus": config.ray_cpus or (os.cpu_count() or 1)},
    }
    run_simulation(
        server_app=app,
        client_app=make_client_app(
            task=config.task, task_params=config.task_params, device=config.device
        ),
        num_supernodes=task.num_users,
        backend_config=backend,
    )
    if not done:
        raise RuntimeError("the Flower simulation ended without finishing the run (see its log)")
    return done[0]


# -- entry points ----------------------------------------------------------------------------------


class _Progress:
    """A progress bar (round, task metric, ε) on a terminal; one line per round otherwise."""

    def __init__(self, total: int, done: int) -> None:
        self.total = total
        self.bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("round"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[shown]}"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False,
            )  # fmt: skip
            self.task = self.bar.add_task("run", total=total, completed=done, shown="")
            self.bar.start()

    def __call__(self, row: dict[str, Any]) -> None:
        metric = next(
            (k for k in ("eval_recall_at_5", "eval_accuracy", "eval_loss") if k in row), None
        )
        shown = f"{metric}={row[metric]:.4f}  " if metric else ""
        shown += f"epsilon={row['epsilon']:.4g}"
        if self.bar is not None:
            self.bar.update(self.task, completed=row["round"], shown=shown)
        else:
            print(
                f"round {row['round']:>4}/{self.total}  {shown}  ({row['seconds']:.2f} s)",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _execute(
    out: Path, config: RunConfig, task: Task, alg: ServerAlgorithm, progress: bool
) -> RunOutcome:
    writer = RunWriter(out, config, alg, task)
    bar = _Progress(config.strategy.num_server_rounds, alg.round_num) if progress else None
    writer.progress = bar
    try:
        if config.engine == "flower":
            logging.getLogger("flwr").setLevel(logging.WARNING)
            reason = _run_flower(config, task, alg, writer)
        else:
            reason = _run_fast(config, task, alg, writer)
    finally:
        if bar is not None:
            bar.close()
    alg.stopped_reason = reason
    if alg.round_num and (alg.round_num % config.checkpoint_every):
        writer.save_checkpoint()
    writer.write_summary(reason)
    return RunOutcome(out, alg.params, alg.epsilon(), alg.round_num, reason, writer.rows)


def simulate(
    config: RunConfig, out_dir: str | Path, *, progress: bool = False, overwrite: bool = False
) -> RunOutcome:
    """Run ``config`` from scratch into ``out_dir``."""
    task, alg = build_run(config)
    out = prepare_run_dir(out_dir, config, overwrite=overwrite)
    return _execute(out, config, task, alg, progress)


def load_checkpoint(out: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint of ``out`` (falls back to the previous one)."""
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        path = out / name
        if not path.exists():
            continue
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a torn or corrupt file: try the previous one
            logging.getLogger(__name__).warning("checkpoint %s is unreadable (%s)", path, exc)
    return None


def resume(out_dir: str | Path, *, progress: bool = False) -> RunOutcome:
    """Continue the run in ``out_dir`` from its last good checkpoint."""
    out = Path(out_dir)
    if not (out / CONFIG_FILE).is_file():
        raise ValueError(f"--resume directory {str(out)!r} has no {CONFIG_FILE}")
    config = load_config(out / CONFIG_FILE)
    task, alg = build_run(config)
    state = load_checkpoint(out)
    rows = read_rows(out / METRICS_FILE)
    if state is not None:
        alg.load_state_dict(state["algorithm"])
        rows = [r for r in rows if r["round"] <= alg.round_num]
    else:
        rows = []
    text = "".join(_json_line(r) for r in rows)
    _atomic_write_bytes(out / METRICS_FILE, text.encode())
    return _execute(out, config, task, alg, progress)
