"""The simulation run loop: engines, metrics files, checkpoints and resume.

A run directory holds

- ``config.toml``: the resolved configuration (what ``--resume`` reads back);
- ``metrics.jsonl``: one JSON object per evaluated round (``round``, ``epsilon``, ``delta``,
  ``eval_*`` task metrics, ``cohort_size``, ``seconds`` and the round's mechanism metrics);
- ``summary.json``: strategy, rounds completed, final metrics, ε, δ, why the run stopped, the
  threat model and (``adadps``) the side information: kind, parameters, public users;
- ``checkpoint.pt`` (and the previous one, ``checkpoint.prev.pt``): the server state after the
  last checkpointed round, written atomically (temporary file, fsync, rename);
- ``privacy_ledger.jsonl``: what every released round released, the source of every reported ε;
- ``run.lock``: held by the one process writing the directory.

How the directory is claimed and locked: :mod:`fedprivopt.simulation.rundir`; its privacy ledger:
:mod:`fedprivopt.simulation.ledger`.

Both engines drive the same :class:`~fedprivopt.strategies.ServerAlgorithm`: ``fast`` in process
with :class:`~fedprivopt.clients.LocalTrainer`, ``flower`` through Flower's simulation engine (Ray)
with :class:`~fedprivopt.strategies.flower.DPStrategy`. All randomness is keyed by (seed, round,
user), so a resumed run ends with the same model and ε as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models import build_task
from fedprivopt.models.side_information_config import (
    ResolvedSideInformation,
    build_side_information,
    resolve_side_information,
)
from fedprivopt.models.task import Task, frozen_mask, initial_flat, model_spec, primary_metric
from fedprivopt.privacy.accounting import check_ledger
from fedprivopt.privacy.flat import unflatten
from fedprivopt.privacy.rng import RngFactory
from fedprivopt.simulation import interrupt
from fedprivopt.simulation.config import RunConfig, load_config
from fedprivopt.simulation.fast import local_config, make_cohort_train
from fedprivopt.simulation.ledger import (
    CONFIG_FILE,
    LEDGER_FILE,
    METRICS_FILE,
    OldLedgerError,
    RunLedger,
)
from fedprivopt.simulation.rundir import (
    CHECKPOINT,
    LOCK_FILE,
    PREVIOUS_CHECKPOINT,
    SUMMARY_FILE,
    NewRunDir,
    lock_run_dir,
)
from fedprivopt.strategies.algorithms import build_algorithm
from fedprivopt.strategies.core import RoundResult, ServerAlgorithm, TrainRequest, drive_round

__all__ = [
    "CHECKPOINT",
    "CONFIG_FILE",
    "LEDGER_FILE",
    "LOCK_FILE",
    "METRICS_FILE",
    "PREVIOUS_CHECKPOINT",
    "SUMMARY_FILE",
    "RunOutcome",
    "RunWriter",
    "build_run",
    "resume",
    "serve_flower",
    "simulate",
    "start_run_files",
]


@dataclass
class RunOutcome:
    """What :func:`simulate` returns."""

    out_dir: Path
    params: torch.Tensor
    epsilon: float
    rounds_completed: int
    stopped_reason: str
    rows: list[dict[str, Any]]
    metric: str = "eval_accuracy"
    """The task's headline metric (:func:`~fedprivopt.models.task.primary_metric`)."""


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


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)  # any other character literally (TOML files are UTF-8)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def config_to_toml(config: RunConfig) -> str:
    """The resolved configuration as a preset (loadable by :func:`load_config`)."""
    data = config.to_mapping()
    tables = {key: data.pop(key) for key in list(data) if isinstance(data[key], dict)}
    lines = [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in data.items()]
    for name, table in tables.items():  # side-information, task-params
        lines += ["", f"[{_toml_key(name)}]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
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


def start_run_files(out: Path, config: RunConfig, alg: ServerAlgorithm) -> RunLedger:
    """Write ``config.toml`` and the privacy ledger's header into a claimed, locked directory.

    ``out`` comes from :class:`~fedprivopt.simulation.rundir.NewRunDir` (new, empty, or a run
    of ours being overwritten). Returns the new ledger.
    """
    _atomic_write_bytes(out / CONFIG_FILE, config_to_toml(config).encode())
    return RunLedger.create(out, config, alg.accountant)


class RunWriter:
    """Writes the ledger lines, rows, checkpoints and the summary of one run directory.

    With a ``ledger`` (every run of :func:`simulate`, :func:`resume` and a deployment) each round
    is recorded in it before its row, checkpoint or next broadcast, the accountant is set from
    it, and the summary's ε is composed from it. Without one (benchmarks) nothing is recorded.
    """

    def __init__(
        self,
        out: Path,
        config: RunConfig,
        algorithm: ServerAlgorithm,
        task: Task,
        ledger: RunLedger | None = None,
    ):
        self.out = out
        self.config = config
        self.algorithm = algorithm
        self.task = task
        self.ledger = ledger
        self.rows = read_rows(out / METRICS_FILE)
        self.last_time = time.perf_counter()
        self.progress: Callable[[dict[str, Any]], None] | None = None

    def save_checkpoint(self) -> None:
        """Atomically replace the checkpoint, keeping the previous one.

        Order (each step fsynced): the round was recorded in the privacy ledger by
        :meth:`on_round` already; (1) the new checkpoint, with a SHA-256 digest of its content, is
        written to a temporary file; (2) the current checkpoint becomes the previous one and the
        temporary file the current one (two renames). At every instant a complete checkpoint
        exists, and a torn or bit-flipped one is recognised by :func:`load_checkpoint`.
        """
        import io

        out, ckpt = self.out, self.out / CHECKPOINT
        state = {"algorithm": self.algorithm.state_dict(), "rows": len(self.rows)}
        state["sha256"] = _state_digest(state)
        buf = io.BytesIO()
        torch.save(state, buf)
        tmp = ckpt.with_name(ckpt.name + ".tmp")
        _write_synced(tmp, buf.getvalue())
        if ckpt.exists():
            os.replace(ckpt, out / PREVIOUS_CHECKPOINT)
        os.replace(tmp, ckpt)
        _fsync_dir(out)

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
        """Record one finished round: the ledger line, a metrics row if evaluated, a checkpoint.

        The ledger line (fsynced) comes first, before anything of the round leaves: its row, its
        checkpoint, the next round's broadcast.
        """
        now = time.perf_counter()
        seconds, self.last_time = now - self.last_time, now
        r = result.round_num
        epsilon = result.metrics["epsilon"]
        if self.ledger is not None:
            alg = self.algorithm
            self.ledger.record(r, alg.round_events(), result.params, alg.accountant)
            epsilon = alg.epsilon()
        if eval_metrics is not None:
            row = {
                "round": r,
                "epsilon": epsilon,
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

    def _reference(self) -> dict[str, Any] | None:
        """The task's untrained public reference model and its metrics (e.g. the tag prior)."""
        make = getattr(self.task, "reference", None)
        if not callable(make):
            return None
        name, metrics = make()
        return {"name": name, "metrics": {f"eval_{k}": v for k, v in metrics.items()}}

    def epsilon(self) -> float:
        """ε of everything this directory released: from the ledger (the algorithm's without)."""
        if self.ledger is not None:
            return self.ledger.epsilon()
        return self.algorithm.epsilon()

    def write_summary(self, stopped_reason: str) -> dict[str, Any]:
        """Write ``summary.json`` for the run as it stands."""
        c = self.config
        side = side_information_of(c, self.task)
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
            "epsilon": self.epsilon(),
            "delta": c.strategy.delta,
            "accountant": c.strategy.accountant,
            "stopped_reason": stopped_reason,
            "primary_metric": primary_metric(self.task),
            "final": final,
            "noise_mode": c.strategy.noise_mode if c.strategy.private else "none",
            "threat_model": _threat_model(c, side),
            "evaluated_model": _evaluated_model(c),
            "initial_model": getattr(self.task, "initialization", None),
            "side_information": None if side is None else side.summary(),
            "reference": self._reference(),
            "config": c.to_mapping(),
        }
        _atomic_write_bytes(
            self.out / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=True).encode()
        )
        return summary


def _evaluated_model(config: RunConfig) -> str:
    beta = config.strategy.ema_decay
    if beta <= 0:
        return "the last iterate"
    return (
        f"the exponential moving average (decay {beta:g}) of the released iterates: "
        "post-processing, no privacy cost"
    )


def _threat_model(config: RunConfig, side: ResolvedSideInformation | None = None) -> str:
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
        kind = f" ({side.kind})" if side is not None else ""
        text += f"; the side information{kind} must be public: it is not covered by the guarantee"
        if side is not None and side.public_users:
            text += "; " + side.exclusion()
    return text


# -- building blocks -------------------------------------------------------------------------------


def side_information_of(config: RunConfig, task: Task) -> ResolvedSideInformation | None:
    """The resolved side information of an ``adadps`` run (``None`` for other strategies).

    Cheap (nothing is computed from data); raises ``ValueError`` naming the key on settings that
    do not fit the task or the population.
    """
    s = config.strategy
    if s.strategy != "adadps":
        return None
    return resolve_side_information(
        config.side_information,
        task,
        population=s.population,
        clients_per_round=s.clients_per_round,
        batch_size=s.batch_size,
        max_examples=s.max_examples,
    )


def build_run(config: RunConfig) -> tuple[Task, ServerAlgorithm]:
    """Build the task and the server algorithm; raises ``ValueError`` on inconsistent settings.

    For ``adadps`` the side information is built here (:func:`side_information_of`). With
    ``public-users`` the first ``k`` users are public: the algorithm's population is the private
    ``N - k`` (sampler, sample rate ``m̄/(N - k)``, accountant, minimum shares) and its sampled
    ids ``0 .. N-k-1`` map to the task's users ``k .. N-1`` (``ServerAlgorithm.user_offset``), so
    the public users are never sampled, accounted or trained on privately, on every engine.
    """
    task = build_task(config.task, **config.task_params)
    if task.num_users != config.strategy.population:
        raise ValueError(
            f"population must equal the number of users of task {config.task!r} "
            f"({task.num_users}), got {config.strategy.population}"
        )
    init = initial_flat(task)
    strategy, side, offset = config.strategy, None, 0
    resolved = side_information_of(config, task)
    if resolved is not None:
        side = build_side_information(resolved, task)
        if resolved.public_users:
            offset = len(resolved.public_users)
            strategy = dataclasses.replace(strategy, population=resolved.private_population)
    alg = build_algorithm(
        strategy, init, preconditioner=side, user_offset=offset, frozen=frozen_mask(task)
    )
    event = alg.round_event()
    if event is not None and strategy.accountant == "prv":
        # a PRV domain too large for memory fails here, before training (PLD: in the algorithm)
        planned = strategy.num_server_rounds * alg.events_per_round
        check_ledger([(event, planned)], strategy.delta, accountant="prv")
    return task, alg


def fast_train(trainer: LocalTrainer, secure: bool) -> Callable[[TrainRequest], dict]:
    """The fast engine's client side: train every requested user in process."""

    def train(request: TrainRequest) -> dict[int, torch.Tensor]:
        cfg = request.client_config
        local = local_config(cfg)
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
    train = make_cohort_train(
        task,
        device=_device(config.device),
        vectorize=config.vectorize,
        chunk_users=config.cohort_chunk,
        secure=config.strategy.secure,
        actors=config.fast_actors,
        task_name=config.task,
        task_params=config.task_params,
    )
    threads = torch.get_num_threads()
    if alg.params.numel() < SMALL_MODEL:
        # measured on 2 cores: 5.7 ms per toy user with 1 thread, 45 ms with 2 (contention)
        torch.set_num_threads(1)
    try:
        for r in range(alg.round_num + 1, config.strategy.num_server_rounds + 1):
            if not alg.budget_allows_next_round():
                return "budget"
            result = drive_round(alg, r, train)
            metrics = writer.evaluate(alg.output_params()) if writer.wants_eval(r) else None
            writer.on_round(result, metrics)
        return "rounds"
    finally:
        torch.set_num_threads(threads)
        close = getattr(train, "close", None)
        if close is not None:
            close()


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
        # ``arrays`` is the released iterate, alg.params; with ema-decay the average is evaluated
        if server_round == 0 or not writer.wants_eval(server_round):
            return None
        return MetricRecord(writer.evaluate(alg.output_params()))

    strategy = DPStrategy(alg, spec, min_nodes=min_nodes, on_round=writer.on_round)
    writer.last_time = time.perf_counter()
    strategy.start(
        grid,
        flat_to_arrays(alg.params, spec),
        num_rounds=config.strategy.num_server_rounds,
        timeout=float(config.round_timeout),
        evaluate_fn=evaluate_fn,
    )
    return alg.stopped_reason or "rounds"


def _run_flower(config: RunConfig, task: Task, alg: ServerAlgorithm, writer: RunWriter) -> str:
    """Run the rounds through Flower's simulation engine (Ray).

    Flower runs the ServerApp in a thread of its own that is not a daemon. If the engine ends
    early (Ctrl-C, an error), that thread is stopped through :func:`interrupt.stoppable_grid`
    at its next call (after the round it is recording) and waited for, so the process can exit.
    A first signal does only that (:func:`interrupt.signals_stop`): the ServerApp returns and
    Flower stops its engine and Ray in its own order; then the run raises
    :class:`interrupt.Interrupted`.
    """
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedprivopt.clients.client_app import make_client_app

    app = ServerApp()
    done: list[str] = []
    stop = threading.Event()
    server: list[threading.Thread] = []

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        server.append(threading.current_thread())
        try:
            stoppable = interrupt.stoppable_grid(grid, stop)
            done.append(serve_flower(stoppable, config, task, alg, writer))
        except interrupt.Stopped:
            pass  # the engine was stopped: the main thread reports why

    backend = {
        "client_resources": {"num_cpus": config.client_cpus, "num_gpus": config.client_gpus},
        "init_args": {"num_cpus": config.ray_cpus or (os.cpu_count() or 1)},
    }
    with interrupt.signals_stop(stop) as received:
        try:
            run_simulation(
                server_app=app,
                client_app=make_client_app(
                    task=config.task, task_params=config.task_params, device=config.device
                ),
                num_supernodes=task.num_users,
                backend_config=backend,
            )
        finally:
            stop.set()
            for thread in server:
                thread.join(timeout=SERVER_STOP_WAIT)
    if received:
        raise interrupt.Interrupted(received[0])
    if not done:
        raise RuntimeError("the Flower simulation ended without finishing the run (see its log)")
    return done[0]


SERVER_STOP_WAIT = 60.0
"""Seconds an interrupted Flower run waits for its ServerApp thread to finish its step."""


# -- entry points ----------------------------------------------------------------------------------


class _Progress:
    """A progress bar (round, task metric, ε) on a terminal; one line per round otherwise."""

    def __init__(self, total: int, done: int, metric: str) -> None:
        self.total = total
        self.metric = metric
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
        metric = next((k for k in (self.metric, "eval_loss") if k in row), None)
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
    out: Path,
    config: RunConfig,
    task: Task,
    alg: ServerAlgorithm,
    progress: bool,
    ledger: RunLedger,
) -> RunOutcome:
    writer = RunWriter(out, config, alg, task, ledger)
    bar = (
        _Progress(config.strategy.num_server_rounds, alg.round_num, primary_metric(task))
        if progress
        else None
    )
    writer.progress = bar
    uses_ray = config.engine == "flower" or config.fast_actors > 0
    try:
        with interrupt.signals_raise(), interrupt.own_processes(uses_ray):
            if config.engine == "flower":
                logging.getLogger("flwr").setLevel(logging.WARNING)
                reason = _run_flower(config, task, alg, writer)
            else:
                reason = _run_fast(config, task, alg, writer)
    except BaseException as exc:  # Ctrl-C, SIGTERM, SIGHUP: the checkpoint stays, no summary
        stopped = interrupt.as_interrupt(exc)
        if stopped is None:
            raise
        raise interrupt.Interrupted(stopped.signum, out) from exc
    finally:
        if bar is not None:
            bar.close()
    alg.stopped_reason = reason
    if alg.round_num and (alg.round_num % config.checkpoint_every):
        writer.save_checkpoint()
    writer.write_summary(reason)
    return RunOutcome(
        out, alg.params, writer.epsilon(), alg.round_num, reason, writer.rows, primary_metric(task)
    )


def simulate(
    config: RunConfig, out_dir: str | Path, *, progress: bool = False, overwrite: bool = False
) -> RunOutcome:
    """Run ``config`` from scratch into ``out_dir``.

    ``out_dir`` must be new or empty; with ``overwrite`` it may also hold a run of ours, which
    is replaced. Anything else is refused (``ValueError``) before anything is written. The
    directory is locked for the whole run; a start that fails before its first released round
    leaves nothing behind (see :class:`~fedprivopt.simulation.rundir.NewRunDir`).
    """
    task, alg = build_run(config)
    with NewRunDir(out_dir, overwrite=overwrite) as out:
        ledger = start_run_files(out, config, alg)
        return _execute(out, config, task, alg, progress, ledger)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _state_digest(state: dict[str, Any]) -> str:
    """SHA-256 over a canonical walk of a checkpoint (its ``sha256`` entry excluded).

    Tensors contribute dtype, shape and raw bytes; dicts their sorted keys; other leaves their
    ``repr`` (exact for floats). ``torch.load`` does not check the zip CRCs, so a flipped bit in a
    tensor would otherwise load silently.
    """
    import hashlib

    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for key in sorted(x, key=repr):
                h.update(repr(key).encode())
                walk(x[key])
        elif isinstance(x, (list, tuple)):
            h.update(f"L{len(x)}".encode())
            for item in x:
                walk(item)
        else:
            h.update(f"S{x!r}".encode())

    walk({k: v for k, v in state.items() if k != "sha256"})
    return h.hexdigest()


def _check_checkpoint(state: Any) -> None:
    if not isinstance(state, dict) or not isinstance(state.get("algorithm"), dict):
        raise ValueError("not a fedprivopt checkpoint (no 'algorithm' state)")
    missing = {"round", "params", "accountant", "config"} - set(state["algorithm"])
    if missing:
        raise ValueError(f"algorithm state lacks {sorted(missing)}")
    if "sha256" in state and state["sha256"] != _state_digest(state):
        raise ValueError("content does not match its SHA-256 digest")


def load_checkpoint(out: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint of ``out`` (falls back to the previous one).

    A checkpoint is unreadable when ``torch.load`` fails (torn, truncated), when it is not a
    checkpoint's structure, or when its content does not match the SHA-256 digest stored in it
    (a bit flip; checkpoints written before digests existed are accepted without one). Returns
    ``None`` when no checkpoint is readable; :func:`resume` decides whether that is an error.
    """
    return _newest_checkpoint(out)[0]


def _newest_checkpoint(out: Path) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`load_checkpoint` and the name of the file it read."""
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        path = out / name
        if not path.exists():
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            _check_checkpoint(state)
            return state, name
        except Exception as exc:  # a torn or corrupt file: try the previous one
            logging.getLogger(__name__).warning("checkpoint %s is unreadable (%s)", path, exc)
    return None, None


def _refuse_restart(out: Path, config: RunConfig, last_released: int) -> None:
    """Raise unless restarting from round 0 keeps the privacy ledger intact.

    Allowed only when no checkpoint file exists and no round past the first checkpoint is known
    to have been released (a crash before the first checkpoint was complete), or nothing was
    released at all (a run whose budget allowed no round): the restart then redoes those rounds
    (and, in secure mode, :func:`resume` charges their earlier release). A finished run (it has a
    summary) that released rounds but lost its checkpoints is refused.
    """
    present = [n for n in (CHECKPOINT, PREVIOUS_CHECKPOINT) if (out / n).exists()]
    reset = "restarting from round 0 would reset the privacy accountant"
    if present:
        raise ValueError(
            f"no readable checkpoint in {str(out)!r}: {' and '.join(present)} "
            f"{'are' if len(present) > 1 else 'is'} unreadable (see the log); {reset} "
            f"(rounds up to {last_released} were released). Restore a checkpoint or start a new "
            "run in another directory"
        )
    first = min(config.checkpoint_every, config.strategy.num_server_rounds)
    if last_released > first or (last_released and (out / SUMMARY_FILE).exists()):
        raise ValueError(
            f"{str(out)!r} has no checkpoint, but its metrics, summary or privacy ledger show "
            f"rounds up to {last_released} were released; {reset}. Restore a checkpoint or "
            "start a new run in another directory"
        )


def _shown_rounds(out: Path, rows: list[dict[str, Any]]) -> int:
    """The last round the metrics rows and ``summary.json`` show as released (0 if none)."""
    released = [int(r["round"]) for r in rows]
    summary_path = out / SUMMARY_FILE
    if summary_path.exists():
        try:
            released.append(int(json.loads(summary_path.read_text())["rounds_completed"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{summary_path} is unreadable ({exc})") from None
    return max(released, default=0)


def resume(out_dir: str | Path, *, progress: bool = False) -> RunOutcome:
    """Continue the run in ``out_dir`` from its last good checkpoint.

    The directory is locked for the whole run (a second process is refused, naming this one's
    PID). What was released is what ``privacy_ledger.jsonl`` records, and ε is always composed
    from it (:class:`~fedprivopt.simulation.ledger.RunLedger`):

    * a ``config.toml`` that differs from the ledger's header in a privacy-relevant key, or
      whose round events differ from those the ledger records, is refused naming the key;
    * a checkpoint whose accountant does not hold exactly the events the ledger shows were
      released by its round is refused; so is a ledger that ends before the metrics rows or the
      summary (truncated);
    * if checkpoint files exist but none is readable, or none exists while rounds past the first
      checkpoint were released, this raises ``ValueError`` instead of restarting from round 0;
    * **seeded mode**: rounds after the restored checkpoint are redone with the same randomness;
      a redone round whose model has the SHA-256 its first release recorded is that release
      again and is not charged twice; one that differs is a new release and is charged;
    * **secure mode**: noise comes from OS entropy, so every redone round is a new release: the
      accountant starts from the whole ledger and the redone rounds add their own events. ε
      therefore exceeds that of an uninterrupted run by the lost rounds, and a target ε may stop
      the run earlier.

    A ledger of an earlier version (event counts only), or none, is rebuilt conservatively from
    a readable checkpoint (:meth:`RunLedger.convert`) and refused without one. Rows after the
    restored round are dropped (they are recomputed). An unreadable newest checkpoint is renamed
    ``checkpoint.pt.bad``, so the good previous one is kept until the next checkpoint replaces
    it.
    """
    out = Path(out_dir)
    if not (out / CONFIG_FILE).is_file():
        raise ValueError(f"--resume directory {str(out)!r} has no {CONFIG_FILE}")
    with lock_run_dir(out):
        return _resume_locked(out, progress)


def _resume_locked(out: Path, progress: bool) -> RunOutcome:
    if not (out / CONFIG_FILE).is_file():
        raise ValueError(f"--resume directory {str(out)!r} has no {CONFIG_FILE}")
    config = load_config(out / CONFIG_FILE)
    old: OldLedgerError | None = None
    try:
        ledger = RunLedger.read(out)
    except OldLedgerError as exc:
        ledger, old = None, exc
    if ledger is not None:
        ledger.check_config(config, str(out / CONFIG_FILE))
    task, alg = build_run(config)
    if ledger is not None:
        ledger.check_algorithm(alg)
    rows = read_rows(out / METRICS_FILE)
    shown = _shown_rounds(out, rows)
    if ledger is not None and shown > ledger.last_round:
        raise ValueError(
            f"{ledger.path} ends at round {ledger.last_round}, but {METRICS_FILE} or "
            f"{SUMMARY_FILE} show round {shown} was released: the ledger is incomplete "
            "(truncated or edited); refusing to resume"
        )
    last_released = max(shown, ledger.last_round if ledger else 0, old.max_round if old else 0)
    state, name = _newest_checkpoint(out)
    compare = name  # the checkpoint whose accountant must match the ledger
    if state is None:
        _refuse_restart(out, config, last_released)
    else:
        alg.load_state_dict(state["algorithm"])  # the config and every accountant field checked
    if ledger is None and state is None:
        if old is not None:
            raise ValueError(
                f"{old} and no checkpoint is readable; restarting from round 0 would reset the "
                "privacy accountant (finish the run with the version that started it, or start "
                "a new run in another directory)"
            )
        if last_released:
            raise ValueError(
                f"{str(out)!r} shows rounds up to {last_released} were released, but its "
                f"{LEDGER_FILE} is missing and no checkpoint is readable: what was released "
                "cannot be established, and restarting from round 0 would reset the privacy "
                "accountant; start a new run in another directory"
            )
        ledger = RunLedger.create(out, config, alg.accountant)  # killed before its header
    elif ledger is None:
        ledger = RunLedger.convert(
            out,
            config,
            alg.accountant,
            round_num=alg.round_num,
            checkpoint=name,
            rows=rows,
            last_released=last_released,
            round_events=alg.round_events(),
            old=old,
        )
        compare = None  # the new ledger was built from this checkpoint
    ledger.restore(alg.accountant, alg.round_num, compare, secure=config.strategy.secure)
    if name == PREVIOUS_CHECKPOINT and (out / CHECKPOINT).exists():
        # set the unreadable newest checkpoint aside, or the next save would rotate it over
        # the good previous one
        os.replace(out / CHECKPOINT, out / (CHECKPOINT + ".bad"))
    rows = [r for r in rows if r["round"] <= alg.round_num]
    text = "".join(_json_line(r) for r in rows)
    _atomic_write_bytes(out / METRICS_FILE, text.encode())
    return _execute(out, config, task, alg, progress, ledger)
