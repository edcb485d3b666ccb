"""The privacy ledger of a run directory is the truth about what was released.

A user may edit every file of their own run directory. These tests edit them the ways that used
to make ``simulate --resume`` report an ε below what the directory had already released, and
check that each is now refused (``ValueError`` naming the key or file; exit code 2 on the command
line) or accounted conservatively.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.privacy import SubsampledGaussianEvent, compose_epsilon
from fedprivopt.simulation.checkpoint import load_checkpoint, state_digest
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import resume, simulate
from tests.simulation.test_run import PRESET, SMALL, small_config


def _set(out: Path, key: str, value: str) -> None:
    """Edit one top-level key of the run's config.toml, as a user with an editor would."""
    lines = (out / "config.toml").read_text().splitlines()
    edited = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in lines]
    assert edited != lines, key
    (out / "config.toml").write_text("\n".join(edited) + "\n")


def _ledger_epsilon(out: Path, delta: float) -> float:
    """ε recomputed from nothing but the ledger's lines (what a reviewer would do)."""
    pairs = []
    for line in read_rows(out / LEDGER_FILE):
        for item in line.get("released", []):
            pairs.append((SubsampledGaussianEvent.from_dict(item["event"]), item["count"]))
    return compose_epsilon(pairs, delta)


def _one_line_exit_2(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# -- every released round is in the ledger, with its event, before anything of it leaves -------


def test_every_released_round_records_its_event_and_the_summary_is_recomputed_from_them(
    tmp_path,
):
    config = small_config(**{"num-server-rounds": 5, "strategy": "dp-fedavg-adadp"})
    outcome = simulate(config, tmp_path / "run")
    lines = read_rows(outcome.out_dir / LEDGER_FILE)
    rounds = [line for line in lines if line["kind"] == "round"]
    assert [line["round"] for line in rounds] == [1, 2, 3, 4, 5]
    event = rounds[0]["released"][0]
    # ADADP: two data accesses per round, the first on the line of its half-step point (sent
    # to the second cohort before the round ends; thirty-third review of issue 15)
    assert event["count"] == 1
    partial = [line for line in lines if line["kind"] == "partial"]
    assert [line["round"] for line in partial] == [1, 2, 3, 4, 5]
    assert all(line["released"] == rounds[0]["released"] for line in partial)
    assert event["event"]["sampling"] == "poisson"
    assert event["event"]["noise_multiplier"] == config.strategy.noise_multiplier
    assert event["event"]["sample_rate"] == config.strategy.sample_rate
    assert all(line["accountant"] == "rdp" for line in rounds)
    assert [line["events"] for line in rounds] == [2, 4, 6, 8, 10]  # cumulative counts
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert summary["epsilon"] == outcome.epsilon == _ledger_epsilon(outcome.out_dir, 1e-4)


def test_the_ledger_line_is_fsynced_before_the_row_and_the_checkpoint(tmp_path, monkeypatch):
    order: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd):
        try:
            order.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        except OSError:
            order.append("?")
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run")
    files = [name for name in order if name in (LEDGER_FILE, "metrics.jsonl", CHECKPOINT + ".tmp")]
    # the ledger's header when the run starts; then per round: the ledger line, the metrics row
    # and the checkpoint, in this order
    assert files == [LEDGER_FILE] + [LEDGER_FILE, "metrics.jsonl", CHECKPOINT + ".tmp"] * 3


# -- the attack of the issue: kill, edit the noise multiplier, resume ----------------------------


def test_editing_the_noise_multiplier_after_a_kill_is_refused(tmp_path, capsys):
    """SIGKILL after 7+ rounds with no checkpoint yet, σ 0.5 -> 50 in config.toml, --resume:
    this used to restart from round 0 with σ = 50 and report ε 0.057 where 17.36 was spent."""
    out = tmp_path / "killed"
    sets = {**SMALL, "num-server-rounds": 100_000, "checkpoint-every": 100_000}
    argv = [sys.executable, "-m", "fedprivopt.cli", "simulate", str(PRESET), "--out", str(out)]
    argv += ["--quiet", *[f"--set={k}={v}" for k, v in sets.items()]]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if len(read_rows(out / "metrics.jsonl")) >= 7:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    released = max(line["round"] for line in read_rows(out / LEDGER_FILE))
    assert released >= 7 and not (out / CHECKPOINT).exists()
    spent = _ledger_epsilon(out, 1e-4)
    assert spent > 10  # σ = 0.5, q = 1/3, 7+ rounds
    _set(out, "noise-multiplier", "50.0")
    with pytest.raises(ValueError, match="noise-multiplier") as info:
        resume(out)
    assert len(str(info.value).splitlines()) == 1
    _one_line_exit_2(["simulate", "--resume", str(out), "--quiet"], capsys, "noise-multiplier")
    assert _ledger_epsilon(out, 1e-4) == spent  # nothing was lost or added


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("clients-per-round", "1.0"),
        ("population", "13"),
        ("sampling", '"fixed"'),
        ("accountant", '"pld"'),
        ("delta", "0.5"),
        ("strategy", '"fedavg"'),
        ("secure", "true"),
        ("seed", "7"),
    ],
)
def test_any_privacy_relevant_edit_is_refused_naming_the_key(tmp_path, key, value):
    out = simulate(small_config(), tmp_path / "run").out_dir
    (out / CHECKPOINT).unlink()
    (out / PREVIOUS_CHECKPOINT).unlink()  # no checkpoint to compare with: the ledger must catch it
    _set(out, key, value)
    with pytest.raises(ValueError, match=re.escape(f"{key} = {value}, but the run's privacy")):
        resume(out)


def test_an_unedited_restart_replays_the_released_rounds_without_charging_them_twice(tmp_path):
    reference = simulate(small_config(**{"num-server-rounds": 9}), tmp_path / "ref")
    config = small_config(**{"num-server-rounds": 7, "checkpoint-every": 100})
    out = simulate(config, tmp_path / "run").out_dir
    # the state of a kill after round 7's row, before any checkpoint
    (out / CHECKPOINT).unlink()
    (out / PREVIOUS_CHECKPOINT).unlink(missing_ok=True)
    (out / "summary.json").unlink()
    _set(out, "num-server-rounds", "9")
    outcome = resume(out)
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon == _ledger_epsilon(out, 1e-4)


def test_a_ledger_deleted_before_any_checkpoint_is_refused(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 7, "checkpoint-every": 100}),
                   tmp_path / "run").out_dir  # fmt: skip
    (out / CHECKPOINT).unlink()
    (out / PREVIOUS_CHECKPOINT).unlink(missing_ok=True)
    (out / "summary.json").unlink()
    (out / LEDGER_FILE).unlink()
    _set(out, "noise-multiplier", "50.0")
    with pytest.raises(ValueError, match=LEDGER_FILE):
        resume(out)


def test_a_truncated_ledger_is_refused(tmp_path):
    out = simulate(small_config(), tmp_path / "run").out_dir
    lines = (out / LEDGER_FILE).read_text().splitlines(keepends=True)
    (out / LEDGER_FILE).write_text("".join(lines[:-2]))  # the last two rounds' lines removed
    with pytest.raises(ValueError, match=LEDGER_FILE):
        resume(out)


def test_an_edited_ledger_line_is_refused(tmp_path):
    out = simulate(small_config(), tmp_path / "run").out_dir
    lines = read_rows(out / LEDGER_FILE)
    lines[3]["released"][0]["count"] = 0
    (out / LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ValueError, match=LEDGER_FILE):
        resume(out)


# -- checkpoints must agree with the ledger -------------------------------------------------------


def _forge_checkpoint(path: Path, events: int) -> None:
    """Lower the accountant's count in a checkpoint and recompute its digest (our own function)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["algorithm"]["accountant"]["ledger"][0]["count"] = events
    state["sha256"] = state_digest(state)
    torch.save(state, path)


@pytest.mark.parametrize("secure", [False, True], ids=["seeded", "secure"])
def test_a_checkpoint_claiming_fewer_events_than_the_ledger_is_refused(tmp_path, secure):
    """Seeded mode used to accept it: ε 13.70 for 8 rounds whose true ε is 18.41."""
    out = simulate(small_config(**{"num-server-rounds": 8, "secure": secure}),
                   tmp_path / "run").out_dir  # fmt: skip
    _forge_checkpoint(out / CHECKPOINT, 5)
    _set(out, "num-server-rounds", "10")
    with pytest.raises(ValueError, match=CHECKPOINT) as info:
        resume(out)
    assert "5" in str(info.value) and "8" in str(info.value)


def test_a_ledger_edited_with_its_config_cannot_lower_the_reported_epsilon(tmp_path):
    """Found by a later review: σ 0.5 -> 50 in the ledger's events and header *and* in config.toml
    (no checkpoint yet) resumed with ε 0.06 where metrics.jsonl had shown 19.46."""
    out = simulate(small_config(**{"checkpoint-every": 100}), tmp_path / "run").out_dir
    shown = read_rows(out / "metrics.jsonl")[-1]["epsilon"]
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT, "summary.json"):
        (out / name).unlink(missing_ok=True)
    text = (out / LEDGER_FILE).read_text()
    forged = text.replace('"noise_multiplier": 0.5', '"noise_multiplier": 50.0')
    forged = forged.replace('"noise-multiplier": 0.5', '"noise-multiplier": 50.0')
    assert forged != text
    (out / LEDGER_FILE).write_text(forged)
    _set(out, "noise-multiplier", "50.0")
    with pytest.raises(ValueError, match="the ledger was edited") as info:
        resume(out)
    assert f"{shown:.6g}" in str(info.value)


def test_a_refused_resume_leaves_a_torn_ledger_as_it_was_and_an_accepted_one_cuts_it(tmp_path):
    """Found by a later review: reading the ledger cut a torn last line off the file (and removed
    a ledger torn inside its header) even when the resume was then refused."""
    out = simulate(small_config(**{"num-server-rounds": 4}), tmp_path / "run").out_dir
    whole = (out / LEDGER_FILE).read_bytes()
    (out / LEDGER_FILE).write_bytes(whole + b'{"kind": "round", "rou')  # a write killed midway
    before = (out / LEDGER_FILE).read_bytes()
    _set(out, "clip-norm", "9.0")
    with pytest.raises(ValueError, match="clip-norm"):
        resume(out)
    assert (out / LEDGER_FILE).read_bytes() == before
    _set(out, "clip-norm", str(small_config().strategy.clip_norm))
    _set(out, "num-server-rounds", "6")
    resume(out)
    lines = (out / LEDGER_FILE).read_bytes().splitlines(keepends=True)
    assert b"".join(lines[: len(whole.splitlines())]) == whole and all(
        json.loads(x)["kind"] == "round" for x in lines[len(whole.splitlines()) :]
    )


def test_a_checkpoint_with_fewer_events_than_its_rounds_release_is_refused(tmp_path):
    """Found by a later review: with the ledger and the metrics deleted, a checkpoint of round 8
    forged to hold 4 events was carried over (ε 22.11 for rounds whose true ε is over 29)."""
    out = simulate(small_config(**{"num-server-rounds": 8}), tmp_path / "run").out_dir
    _forge_checkpoint(out / CHECKPOINT, 4)
    for name in (LEDGER_FILE, "metrics.jsonl", "summary.json", PREVIOUS_CHECKPOINT):
        (out / name).unlink()
    _set(out, "num-server-rounds", "10")
    refused = "accountant records 4 privacy events of this configuration.s rounds, but its round 8"
    with pytest.raises(ValueError, match=refused):
        resume(out)


@pytest.mark.parametrize("strategy", ["fedavg", "dp-fedavg"])
def test_a_ledger_whose_private_flag_was_flipped_is_refused(tmp_path, strategy):
    """Found by a third review: a non-private run's header set to private resumed with ε 0."""
    config = small_config(**{"num-server-rounds": 4, "strategy": strategy})
    out = simulate(config, tmp_path / "run").out_dir
    flag = config.strategy.private
    text = (out / LEDGER_FILE).read_text()
    old, new = f'"private": {str(flag).lower()}', f'"private": {str(not flag).lower()}'
    (out / LEDGER_FILE).write_text(text.replace(old, new, 1))
    _set(out, "num-server-rounds", "6")
    with pytest.raises(ValueError, match="the ledger was edited"):
        resume(out)


def test_a_checkpoint_whose_events_were_forged_is_refused_without_a_ledger(tmp_path):
    """Found by a third review: both checkpoints forged to σ 50 (digests recomputed), the ledger
    and the metrics deleted: the forged events were carried over (ε 179 for 190.8 spent)."""
    out = simulate(small_config(**{"num-server-rounds": 8}), tmp_path / "run").out_dir
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        state = torch.load(out / name, map_location="cpu", weights_only=True)
        for item in state["algorithm"]["accountant"]["ledger"]:
            item["event"]["noise_multiplier"] = 50.0
        state["sha256"] = state_digest(state)
        torch.save(state, out / name)
    for name in (LEDGER_FILE, "metrics.jsonl", "summary.json"):
        (out / name).unlink()
    _set(out, "num-server-rounds", "10")
    refused = "accountant records 0 privacy events of this configuration.s rounds"
    with pytest.raises(ValueError, match=refused):
        resume(out)


def kept_files(out: Path) -> dict[str, bytes]:
    """The run's files but its rows and lock: what a refused resume leaves as they were (the
    rows are cut back to the checkpoint's round as a resume starts)."""
    return {
        p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("metrics.jsonl", "run.lock")
    }


def differing_replays(monkeypatch) -> list[int]:
    """Make every replayed round's released model differ from its first release, as another
    engine's summation order or a GPU would; returns the rounds so made to differ."""
    record, changed = RunLedger.record, []

    def differing(self, round_num, events, params, *args, **kwargs):
        if self.replay:
            changed.append(round_num)
            params = params + 1e-6
        return record(self, round_num, events, params, *args, **kwargs)

    monkeypatch.setattr(RunLedger, "record", differing)
    return changed


def test_a_seeded_replay_that_differs_from_its_first_release_is_refused(tmp_path, monkeypatch):
    """A redone round draws its first release's cohort and noise (the seed's): released again
    with another model, the two would reveal their difference without noise. Nothing of it is
    released; the run stays resumable. (It used to be charged as a second release, which does
    not cover the pair: twenty-ninth review of issue 15. A checkpoint whose parameters were
    edited used to make one; it is refused since, in ``test_twentyninth_review_ledger``.)"""
    reference = simulate(small_config(), tmp_path / "ref")
    out = simulate(small_config(), tmp_path / "run").out_dir
    (out / CHECKPOINT).unlink()  # resume from round 5's checkpoint: round 6 is redone
    (out / "summary.json").unlink()
    files = kept_files(out)
    with monkeypatch.context() as patch:
        changed = differing_replays(patch)
        with pytest.raises(ValueError, match=r"round 6, redone from the checkpoint, came out"):
            resume(out)
    assert changed == [6]
    assert kept_files(out) == files  # the rows are cut back to the checkpoint
    assert max(row["round"] for row in read_rows(out / "metrics.jsonl")) < 6
    outcome = resume(out)  # the replay as it was: identical, not charged again
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon == _ledger_epsilon(out, 1e-4)


# -- ledgers of earlier versions (event counts only) -------------------------------------------


def _old_ledger(out: Path, counts: list[int]) -> None:
    lines = [{"round": i + 1, "events": c, "kind": "checkpoint"} for i, c in enumerate(counts)]
    (out / LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_an_old_count_only_ledger_is_charged_conservatively(tmp_path):
    out = simulate(small_config(), tmp_path / "run").out_dir
    _old_ledger(out, [1, 2, 3, 4, 5, 9])  # claims more than the checkpoint's 6 events
    _set(out, "num-server-rounds", "7")
    outcome = resume(out)
    assert load_checkpoint(out)["algorithm"]["accountant"]["ledger"][0]["count"] == 10
    assert outcome.epsilon == _ledger_epsilon(out, 1e-4)
    assert (out / (LEDGER_FILE + ".v1")).exists()  # the old file is kept beside the new one


def test_an_old_ledger_without_a_checkpoint_is_refused(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 1}), tmp_path / "run").out_dir
    (out / CHECKPOINT).unlink()
    (out / "summary.json").unlink()
    _old_ledger(out, [1])
    _set(out, "num-server-rounds", "3")
    with pytest.raises(ValueError, match="older fedprivopt"):
        resume(out)


# -- the task's parameters choose the data: recorded, and a resume may not change them ----------


def _set_task_param(out: Path, key: str, value: str) -> None:
    head, tail = (out / "config.toml").read_text().split("[task-params]")
    lines = tail.splitlines()
    edited = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in lines]
    if edited == lines:
        edited.append(f"{key} = {value}")
    (out / "config.toml").write_text(head + "[task-params]" + "\n".join(edited) + "\n")


def test_resuming_on_other_data_is_refused_naming_the_task_parameter(tmp_path, capsys):
    # the toy task's seed draws its users' data: resuming with another used to train the
    # remaining rounds on other users and evaluate them on another test set, with rc 0
    out = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run").out_dir
    _set(out, "num-server-rounds", "5")
    _set_task_param(out, "seed", "7")
    _one_line_exit_2(
        ["simulate", "--resume", str(out)],
        capsys,
        "task-params.seed = 7, but the run's privacy ledger records task-params.seed = 0",
        "(other data, model or evaluation)",
    )
    assert [r["round"] for r in read_rows(out / "metrics.jsonl")] == [1, 2, 3]


def test_a_ledger_written_before_task_parameters_were_recorded_is_refused_by_its_settings(
    tmp_path,
):
    # thirty-ninth review follow-up (ledger 1): this test resumed a header that lost only its
    # task-params, a form no version wrote (ema-decay entered the header with them), and so
    # let a Gaussian run resume on other data; a header of that version lacks ema-decay too
    # and is refused by it (as a run written by that version is: its settings differ)
    out = simulate(small_config(**{"num-server-rounds": 3}), tmp_path / "run").out_dir
    lines = (out / LEDGER_FILE).read_text().splitlines()
    header = json.loads(lines[0])
    assert header["settings"].pop("task-params") == {"num-users": 12, "seed": 0}
    del header["records"], header["settings"]["ema-decay"]
    (out / LEDGER_FILE).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    _set(out, "num-server-rounds", "6")
    with pytest.raises(ValueError, match=r"ema-decay = 0\.0, but the run.s privacy ledger records"):
        resume(out)


def test_where_the_data_lives_may_change_what_it_is_may_not():
    from fedprivopt.simulation.config import resolve_config
    from fedprivopt.simulation.ledger import privacy_settings

    params = {"data-dir": "/a", "cache-dir": "/c", "token-cache": True, "cache-users": 5,
              "vocab-size": 100, "eval-users": 20, "init-bias": "tag-prior"}  # fmt: skip
    config = resolve_config({"task": "stackoverflow-tp", "task-params": params})
    assert privacy_settings(config)["task-params"] == {
        "eval-users": 20,
        "init-bias": "tag-prior",
        "vocab-size": 100,
    }
