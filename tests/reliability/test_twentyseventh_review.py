"""Issue 15, twenty-seventh hostile review: regression tests of its findings.

a. ``simulate toy.toml --engine flower --set round-timeout=1e-9`` was accepted (any number of
   seconds > 0 was): the server waited for no reply, every update of every round was lost
   (``timed_out`` = the cohort) while every round was charged to ε (rc 0, ε 10.28 for 2 rounds
   of nothing). ``round-timeout`` is now at least 1 s (``MIN_ROUND_TIMEOUT``; a toy round on
   the Flower engine takes 0.1-0.2 s, its first about 9 s, and 1 s lost none): rc 2, one line
   naming the key and its bound, before anything is written.
b. ``simulate toy.toml --set client-cpus=1e300`` (also ``client-gpus``) was accepted and
   silently ignored on the fast engine (the Flower engine's check against the machine runs
   only for that engine). Both are now in ``[0, 1e6]`` on every engine: rc 2, one line naming
   the key and its range.
1. ``simulate toy.toml --out D`` where ``D`` held only the user's own ``run.lock`` (17 bytes of
   notes) or ``config.toml.tmp``: both taken for the debris of a start killed before its
   ``config.toml``; the run emptied ``run.lock`` and deleted ``config.toml.tmp`` (rc 0). Debris
   is now a ``run.lock`` that is empty or holds a PID, and a ``config.toml.tmp`` beside one:
   anything else is refused as a directory that is not empty, naming the file.
2. ``compare toy.toml --out P`` where ``P`` held a ``runs/`` of another tool (PyTorch's
   TensorBoard writes ``runs/<date>_<host>/``) and the user's ``report.md`` and ``summary.csv``:
   rc 0, both replaced by the comparison's report. ``runs/`` is now a comparison's only when
   it holds cells' run directories (``strategy__sigmaS__seedN``), and a report beside a
   ``runs/`` holding none is not one compare wrote: rc 2 naming the entry, nothing changed.
3. A finished run whose checkpoint's ``rows`` (the metrics rows written before it, the
   twenty-sixth review's check) was set to ``"3"``, ``None``, NaN, ``True`` or -1 with the
   digest recomputed, and whose last metrics row was deleted: ``--resume`` took the checkpoint
   for one of an earlier version (nothing recorded), skipped the check, and the new summary
   gave round 2's metrics as the final ones of 3 rounds (rc 0). Such a checkpoint is now
   unreadable (``rows must be an integer >= 0``): the previous one is used and the lost round
   redone, or, without one, the resume is refused naming the file.
4. A finished run (toy, 12 rounds) whose ``metrics.jsonl`` rows were reordered (the last
   moved first, or the file ``sort``ed as text: round 9 last) or had an earlier round's row
   appended again: ``--resume`` rc 0, and the new ``summary.json`` and the printed line gave
   that row's metrics as the final ones (0.6133 or 0.7400 for 0.7433; reports sort rows by
   round, the summary took the file's last line). With the last round's row replaced by a copy
   of an earlier one, the row count of the twenty-sixth review's check still held. Now a resume
   rewrites the rows one a round in round order (a round written twice keeps its last row, as
   reports read it), and a finished run with no row of its last round is refused, rc 2 naming
   ``metrics.jsonl`` and the round.
5. ``simulate toy.toml --strategy dp-fedavg-adadp --set server-learning-rate=1e39`` (any rate
   whose half, ADADP's half step, is beyond float32's largest number; also a checkpoint's ADADP
   rate set to 1e308): a ``RuntimeError`` traceback in round 1, rc 1 (torch cannot take such an
   ``alpha``), where every other strategy reports the divergence. The two-half-step point is
   now computed without the ``alpha`` argument at such a rate (the same arithmetic as the full
   step; results at every representable rate unchanged): rc 0, the divergence reported.
6. ``simulate adadps-paper.toml --set side-information.kind=public-users --set
   side-information.eps=1e308`` (also 1e39): rc 2 with ``config: the preconditioner under- or
   overflows float32; use a larger eps``, naming no key and advising the wrong direction.
   ``eps`` is now in ``(0, 1e38]`` (the entries ``sqrt(v)/max + eps`` must fit float32),
   checked with the table: the line names ``side-information.eps`` and the range. Likewise
   ``kind = "two-level"`` with ``factor = 1e308`` (``factor=1e+308 under- or overflows
   float32``) and ``kind = "token-frequency"`` with ``power = 1e300`` or ``bias = 1e308`` (the
   preconditioner line, advising a smaller power, after two lines of numpy's RuntimeWarning):
   the line now names the table's keys and values before the reason, and is the only one.
7. A seeded tree run (``toy.toml`` or ``stackoverflow-tp-mini.toml``, ``noise-mechanism = tree``,
   ``tree-restart-rounds = 5``, ``checkpoint-every = 3``) SIGKILLed after round 4 or 5 was
   released, then ``--resume``: the replay of round 4 from the round-3 checkpoint gave another
   model (last bits) than its first release, the run logged "round 4 differs from its first
   release ...: both are charged", appended round 4 to the ledger again and charged nothing
   (a tree round inside a period releases no event; ε unchanged), and the final model was
   not the uninterrupted run's. The checkpoint keeps the live nodes sorted, and
   ``TreeNoise.release`` subtracts the dropped ones in dict order, which the restore did not
   give back (floating-point subtraction is not associative). The restore now keeps the
   running tree's order: the replay is bit-identical, recorded once.
8. ``simulate stackoverflow-nwp.toml --set 'task-params.synth-user-sizes=[1]'`` (also the tag
   presets, or ``["small"]``): a ``TypeError: unhashable type: 'list'`` traceback, rc 1 (the
   other bad values of the key were one line). Now one line naming
   ``task-params.synth-user-sizes`` and its choices.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedprivopt.cli import main
from tests.reliability.test_twentythird_review import one_line_error

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"


def _simulate(tmp_path, capsys, *argv: str) -> tuple[int, str]:
    """``fedprivopt simulate`` in process: its exit code and standard error."""
    capsys.readouterr()
    try:
        code = main(["simulate", *argv, "--quiet"])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    _simulate.out = captured.out  # type: ignore[attr-defined]
    return code, captured.err


# -- a: a round timeout no reply can meet ---------------------------------------------------------
@pytest.mark.parametrize("value", ["1e-9", "0.001", "0.5", "5e-324"])
@pytest.mark.parametrize("engine", ["fast", "flower"])
def test_a_a_round_timeout_below_one_second_is_refused_naming_the_key(
    tmp_path, capsys, value, engine
):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(TOY), "--engine", engine, "--rounds", "2", "--out", str(out),
        "--set", f"round-timeout={value}",
    )  # fmt: skip
    one_line_error(code, err, "round-timeout", ">= 1")
    assert not out.exists()


def test_a_a_round_timeout_of_one_second_or_more_is_taken():
    from fedprivopt.simulation.config import resolve_config

    for value in (1, 1.0, 20.0, 3600.0, 1e308):
        assert resolve_config({"round-timeout": value}).round_timeout == value


# -- b: client resources beyond any node, ignored by the fast engine ------------------------------
@pytest.mark.parametrize("key", ["client-cpus", "client-gpus"])
@pytest.mark.parametrize("value", ["1e300", "1e7", "1.5e308"])
def test_b_client_resources_beyond_any_node_are_refused_on_the_fast_engine(
    tmp_path, capsys, key, value
):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(TOY), "--rounds", "2", "--out", str(out), "--set", f"{key}={value}"
    )
    one_line_error(code, err, key, "[0, 1e+06]")
    assert not out.exists()


def test_b_client_resources_in_range_are_taken():
    from fedprivopt.simulation.config import resolve_config

    for value in (0, 0.5, 1, 64.0, 1e6):
        config = resolve_config({"client-cpus": value, "client-gpus": value})
        assert config.client_cpus == config.client_gpus == value


# -- 1: a user's file named like the debris of a killed start ------------------------------------
@pytest.mark.parametrize(
    ("name", "content"),
    [("run.lock", "my precious data\n"), ("config.toml.tmp", "my draft\n"), ("run.lock", "x" * 40)],
    ids=["lock-notes", "config-tmp-alone", "lock-long"],
)
def test_1_a_users_file_named_like_debris_is_not_overwritten(tmp_path, capsys, name, content):
    out = tmp_path / "d"
    out.mkdir()
    (out / name).write_text(content)
    code, err = _simulate(tmp_path, capsys, str(TOY), "--rounds", "1", "--out", str(out))
    one_line_error(code, err, "not empty", name)
    assert sorted(p.name for p in out.iterdir()) == [name]
    assert (out / name).read_text() == content


@pytest.mark.parametrize("lock", ["", "12345\n", "4194304"], ids=["empty", "pid-nl", "pid"])
def test_1_the_debris_of_a_killed_start_still_does_not_block(tmp_path, capsys, lock):
    out = tmp_path / "d"
    out.mkdir()
    (out / "run.lock").write_text(lock)
    (out / "config.toml.tmp").write_text("strategy = ")  # a torn atomic write
    code, err = _simulate(tmp_path, capsys, str(TOY), "--rounds", "1", "--out", str(out))
    assert code == 0, err
    assert (out / "summary.json").is_file() and not (out / "config.toml.tmp").exists()


# -- 2: compare over a runs/ and a report that are not a comparison's ----------------------------
def _compare(capsys, out, *extra: str, strategies: str = "dp-fedavg") -> tuple[int, str]:
    capsys.readouterr()
    argv = ["compare", str(TOY), "--strategies", strategies, "--rounds", "1", "--quiet"]
    try:
        code = main([*argv, "--out", str(out), *extra])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("layout", ["tensorboard-runs", "empty-runs", "runs-file"])
def test_2_compare_keeps_a_users_report_beside_a_runs_dir_not_its_own(tmp_path, capsys, layout):
    out = tmp_path / "proj"
    (out / "runs").mkdir(parents=True)
    if layout == "tensorboard-runs":
        (out / "runs" / "Nov29_07-30-00_host").mkdir()
        (out / "runs" / "Nov29_07-30-00_host" / "events.out.tfevents.1.host").write_text("tb")
    elif layout == "runs-file":
        (out / "runs" / "notes.txt").write_text("mine")
    (out / "report.md").write_text("# My thesis notes\n")
    (out / "summary.csv").write_text("a,b\n")
    code, err = _compare(capsys, out)
    one_line_error(code, err, str(out), "compare did not write")
    assert (out / "report.md").read_text() == "# My thesis notes\n"
    assert (out / "summary.csv").read_text() == "a,b\n"
    assert not (out / "runs" / "dp-fedavg__sigma0.5__seed0").exists()


def test_2_an_earlier_comparison_is_still_reused(tmp_path, capsys):
    out = tmp_path / "c"
    assert _compare(capsys, out)[0] == 0
    code, err = _compare(capsys, out)
    assert code == 0, err
    code, err = _compare(capsys, out, strategies="dp-fedavg,fedavg")
    assert code == 0, err
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert names == ["dp-fedavg__sigma0.5__seed0", "fedavg__sigma0__seed0"]


# -- 3: a checkpoint's row count of the wrong form -------------------------------------------------
@pytest.mark.parametrize("rows", ["3", None, float("nan"), True, -1, 3.0])
def test_3_a_checkpoint_whose_row_count_is_not_a_count_is_not_trusted(
    tmp_path, capsys, caplog, rows
):
    import json

    import torch

    from fedprivopt.simulation.checkpoint import state_digest

    out = tmp_path / "r"
    code, err = _simulate(tmp_path, capsys, str(TOY), "--rounds", "3", "--out", str(out))
    assert code == 0, err
    final = json.loads((out / "summary.json").read_text())["final"]["eval_accuracy"]
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["rows"] = rows
    state["sha256"] = state_digest(state)
    torch.save(state, out / "checkpoint.pt")
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    stale = json.loads(lines[-2])["eval_accuracy"]
    assert stale != final
    (out / "metrics.jsonl").write_text("".join(lines[:-1]))  # round 3's row lost
    code, err = _simulate(tmp_path, capsys, "--resume", str(out))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["eval_accuracy"] == final  # round 3 redone, not round 2 reported
    assert "rows must be an integer >= 0" in caplog.text  # the warning: the previous one used
    (out / "checkpoint.prev.pt").unlink()
    torch.save(state, out / "checkpoint.pt")
    code, err = _simulate(tmp_path, capsys, "--resume", str(out))
    one_line_error(code, err, "checkpoint.pt", "rows must be an integer >= 0")


# -- 4: the rows of a finished run reordered or duplicated -----------------------------------------
def _final(out) -> float:
    import json

    return json.loads((out / "summary.json").read_text())["final"]["eval_accuracy"]


@pytest.fixture(scope="module")
def twelve_rounds(tmp_path_factory):
    out = tmp_path_factory.mktemp("r27") / "base"
    assert main(["simulate", str(TOY), "--rounds", "12", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("edit", ["last-first", "sorted-as-text", "row-2-again"])
def test_4_reordered_or_duplicated_rows_do_not_change_the_final_metrics(
    tmp_path, capsys, twelve_rounds, edit
):
    out = tmp_path / "r"
    shutil.copytree(twelve_rounds, out)
    final = _final(out)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines = {
        "last-first": lambda: [lines[-1], *lines[:-1]],
        "sorted-as-text": lambda: sorted(lines),
        "row-2-again": lambda: [*lines, lines[1]],
    }[edit]()
    (out / "metrics.jsonl").write_text("".join(lines))
    code, err = _simulate(tmp_path, capsys, "--resume", str(out))
    assert code == 0, err
    assert _final(out) == final
    assert f"eval_accuracy = {final:.4f}" in _simulate.out  # type: ignore[attr-defined]


def test_4_the_last_rounds_row_replaced_by_an_earlier_one_is_refused(
    tmp_path, capsys, twelve_rounds
):
    out = tmp_path / "r"
    shutil.copytree(twelve_rounds, out)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join([*lines[:-1], lines[-2]]))
    code, err = _simulate(tmp_path, capsys, "--resume", str(out))
    one_line_error(code, err, "metrics.jsonl", "no row of round 12")


# -- 5: ADADP at a learning rate beyond float32 ----------------------------------------------------
@pytest.mark.parametrize("rate", ["1e39", "1e308"])
def test_5_adadp_at_a_rate_beyond_float32_reports_the_divergence(tmp_path, capsys, rate):
    import json

    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(TOY), "--strategy", "dp-fedavg-adadp", "--rounds", "2",
        "--out", str(out), "--set", f"server-learning-rate={rate}",
    )  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err and "diverged" in err
    assert json.loads((out / "summary.json").read_text())["diverged"] == 1


def test_5_adadp_update_takes_any_rate_and_is_unchanged_where_it_fits():
    import torch

    from fedprivopt.optim.adadp import ADADPController, ADADPState

    gen = torch.Generator().manual_seed(0)
    params, d1, d2 = (torch.randn(50, generator=gen) for _ in range(3))
    control = ADADPController(learning_rate=1.0, tolerance=1.0)
    for rate in (1e39, 1e300):
        result = control.update(ADADPState(rate, 0, 0), params, d1 * 1e-30, d2 * 1e-30)
        assert not result.accepted
    loose = ADADPController(learning_rate=1.0, tolerance=1e9)
    result = loose.update(ADADPState(0.7, 0, 0), params, d1, d2)
    assert result.accepted
    assert torch.equal(result.params, (params + 0.35 * d1).add_(d2, alpha=0.35))


# -- 6: public users' eps beyond float32 -----------------------------------------------------------
@pytest.mark.parametrize("eps", ["1e308", "1e39"])
def test_6_a_public_users_eps_beyond_float32_names_the_key(tmp_path, capsys, eps):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(ROOT / "simulations" / "adadps-paper.toml"), "--rounds", "1",
        "--out", str(out), "--set", "side-information.kind=public-users",
        "--set", f"side-information.eps={eps}",
    )  # fmt: skip
    one_line_error(code, err, "side-information.eps", "(0, 1e+38]")
    assert not out.exists()


def test_6_public_users_preconditioner_refuses_such_an_eps_by_name():
    from fedprivopt.models.side_information import public_users_preconditioner

    with pytest.raises(ValueError, match=r"^eps must be a number in \(0, 1e\+38\]"):
        public_users_preconditioner(None, [0], batch_size=1, eps=1e308)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's overflow lines before the error
@pytest.mark.parametrize(
    ("kind", "setting"),
    [("two-level", "factor=1e308"), ("token-frequency", "power=1e300"),
     ("token-frequency", "bias=1e308")],
)  # fmt: skip
def test_6_a_side_information_beyond_float32_names_its_keys(tmp_path, capsys, kind, setting):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(ROOT / "simulations" / "adadps-paper.toml"), "--rounds", "1",
        "--out", str(out), "--set", f"side-information.kind={kind}",
        "--set", f"side-information.{setting}",
    )  # fmt: skip
    key = setting.split("=")[0]
    one_line_error(code, err, f"side-information.{key} = 1e+", "float32")
    assert not out.exists()


# -- 7: a seeded tree run resumed from a checkpoint inside a period --------------------------------
def test_7_tree_noise_restored_releases_what_the_running_tree_releases():
    import torch

    from fedprivopt.privacy.rng import RngFactory
    from fedprivopt.privacy.tree import TreeNoise

    def tree():
        return TreeNoise(std=0.7, restart_rounds=16, rngs=RngFactory(seed=3), dim=1000)

    running = tree()
    running.release(1)
    for r in range(2, 17):
        restored = tree()
        restored.load_state_dict(running.state_dict())
        ahead, again = running.release(r), restored.release(r)
        assert torch.equal(ahead[0], again[0]), r


def test_7_a_seeded_tree_run_resumed_inside_a_period_replays_bit_identically(tmp_path, capsys):
    import torch

    tree = ["--set", "noise-mechanism=tree", "--set", "tree-restart-rounds=5",
            "--set", "clients-per-round=5", "--set", "checkpoint-every=3"]  # fmt: skip
    ref = tmp_path / "ref"
    code, err = _simulate(tmp_path, capsys, str(TOY), "--rounds", "6", "--out", str(ref), *tree)
    assert code == 0, err
    killed = tmp_path / "killed"  # as SIGKILLed after round 5 was released: checkpoint of round 3
    shutil.copytree(ref, killed)
    (killed / "checkpoint.pt").unlink()
    (killed / "checkpoint.prev.pt").rename(killed / "checkpoint.pt")
    (killed / "summary.json").unlink()
    ledger = (killed / "privacy_ledger.jsonl").read_text().splitlines(keepends=True)
    (killed / "privacy_ledger.jsonl").write_text("".join(ledger[:6]))  # header, rounds 1-5
    rows = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(rows[:5]))
    code, err = _simulate(tmp_path, capsys, "--resume", str(killed))
    assert code == 0, err
    assert (killed / "privacy_ledger.jsonl").read_text() == "".join(ledger)  # each round once
    params = [torch.load(d / "checkpoint.pt", weights_only=True)["algorithm"]["params"]
              for d in (ref, killed)]  # fmt: skip
    assert torch.equal(*params)


# -- 8: a list as synth-user-sizes -----------------------------------------------------------------
@pytest.mark.parametrize("preset", ["stackoverflow-nwp.toml", "stackoverflow-tp-mini.toml"])
@pytest.mark.parametrize("value", ["[1]", '["small"]'])
def test_8_a_list_as_synth_user_sizes_is_one_line_naming_the_key(tmp_path, capsys, preset, value):
    out = tmp_path / "r"
    code, err = _simulate(
        tmp_path, capsys, str(ROOT / "simulations" / preset), "--rounds", "1", "--out", str(out),
        "--set", f"task-params.synth-user-sizes={value}",
    )  # fmt: skip
    one_line_error(code, err, "task-params.synth-user-sizes must be one of small, real")
    assert not out.exists()
