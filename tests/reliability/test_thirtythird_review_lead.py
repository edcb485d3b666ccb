"""Thirty-third review of issue 15 (the lead's part): ADADP's half step is in the ledger first.

ADADP (``dp-fedavg-adadp``) trains its second cohort at the half-step point
``w + (η/2)·Δ̃₁``, a function of the round's first noised sum, and sends it out before the round's
model exists. The ledger got one line per round, written at the round's end, so a run stopped
between the two (a kill, a SuperLink lost in a deployment) had released cohort 1's noised sum
with nothing in the ledger, and ``--resume`` redid the round from the checkpoint:

1. in secure mode with fresh noise, a second release of cohort 1's sum that was never charged
   (the ledger showed 6 events for 3 rounds that had released 7);
2. in seeded mode with the seed's noise again: were the redo's cohort 1 to answer differently
   (a client that failed in one of the two), the difference of the two points would reveal the
   difference of the two sums without noise.

Now the half-step point's release is a ``partial`` ledger line (fsynced, the first of the
round's events and the point's digest) written before the point leaves
(``ServerAlgorithm.on_partial_release``, ``RunLedger.record_partial``); the round's line holds
the rest. A secure resume charges the orphan line, a seeded one replays it or refuses a redo
whose point differs, before the second cohort trains. Ledgers written before this (one line a
round) still replay, and a ``partial`` line in a strategy that releases its rounds whole is
refused.
"""

import csv
import json
import re
import secrets
from pathlib import Path

import pytest
import torch
from flwr.app import Error
from flwr.common.constant import ErrorCode

from fedprivopt.cli import main
from fedprivopt.core.text import epsilon_text
from fedprivopt.privacy import SubsampledGaussianEvent, compose_epsilon
from fedprivopt.privacy.flat import flatten
from fedprivopt.simulation.files import CHECKPOINT, LEDGER_FILE, PREVIOUS_CHECKPOINT, read_rows
from fedprivopt.simulation.interrupt import Interrupted
from fedprivopt.simulation.ledger import RunLedger
from fedprivopt.simulation.run import resume, simulate
from fedprivopt.simulation.writer import RunWriter
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.simulation.test_run import PRESET, small_config
from tests.strategies.test_flower_faults import DIM, POPULATION, ScriptedGrid

ADADP = {"strategy": "dp-fedavg-adadp", "num-server-rounds": 3, "checkpoint-every": 1}


def _config(**extra):
    return small_config(**{**ADADP, **extra})


def _lines(out: Path) -> list[dict]:
    return read_rows(out / LEDGER_FILE)[1:]


def _ledger_epsilon(out: Path) -> float:
    pairs = [
        (SubsampledGaussianEvent.from_dict(item["event"]), item["count"])
        for line in _lines(out)
        for item in line["released"]
    ]
    return compose_epsilon(pairs, 1e-4)


def _stopped_after_half_step(monkeypatch, config, out: Path, at: int = 2) -> None:
    """Run ``config`` into ``out`` and stop it (as a kill would) once round ``at``'s half-step
    point was recorded, before the second cohort trained."""
    record = RunWriter.on_partial_release

    def then_stop(self, round_num, events, point):
        record(self, round_num, events, point)
        if round_num == at:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(RunWriter, "on_partial_release", then_stop)
        with pytest.raises(Interrupted):
            simulate(config, out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return simulate(_config(), tmp_path_factory.mktemp("adadp") / "ref")


def test_each_round_records_its_half_step_before_the_round(reference):
    lines = _lines(reference.out_dir)
    assert [(x["kind"], x["round"]) for x in lines] == [
        (kind, r) for r in (1, 2, 3) for kind in ("partial", "round")
    ]
    assert [x["events"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert all(len(x["params_sha256"]) == 64 for x in lines)
    assert reference.epsilon == _ledger_epsilon(reference.out_dir)  # 6 events, as before


def test_a_secure_run_stopped_after_the_half_step_is_charged_for_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _stopped_after_half_step(monkeypatch, _config(secure=True), out)
    assert [x["kind"] for x in _lines(out)][-1] == "partial"  # released, recorded
    outcome = resume(out)
    # before: the ledger showed 6 events for the 7 released (round 2's half step twice)
    assert _lines(out)[-1]["events"] == 7
    assert outcome.epsilon == _ledger_epsilon(out)
    full = simulate(_config(secure=True), tmp_path / "full").epsilon
    assert outcome.epsilon > full


def test_a_seeded_run_stopped_after_the_half_step_replays_it(tmp_path, monkeypatch, reference):
    out = tmp_path / "run"
    _stopped_after_half_step(monkeypatch, _config(), out)
    outcome = resume(out)
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon == _ledger_epsilon(out)
    assert _lines(out) == _lines(reference.out_dir)


def test_a_seeded_redo_whose_half_step_differs_is_refused_before_it_leaves(
    tmp_path, monkeypatch, reference
):
    out = tmp_path / "run"
    _stopped_after_half_step(monkeypatch, _config(), out)
    ledger = (out / LEDGER_FILE).read_bytes()
    record, trained = RunLedger.record_partial, []

    def differing(self, round_num, events, point):
        if self.replay:
            point = point + 1e-6  # as a client that failed in only one of the two would make it
        return record(self, round_num, events, point)

    original = RunWriter.on_round

    def on_round(self, result, eval_metrics):
        trained.append(result.round_num)
        return original(self, result, eval_metrics)

    with monkeypatch.context() as patch:
        patch.setattr(RunLedger, "record_partial", differing)
        patch.setattr(RunWriter, "on_round", on_round)
        with pytest.raises(ValueError, match=r"round 2, redone .* releasing its first cohort's"):
            resume(out)
    assert trained == []  # round 2's second cohort never trained, nothing was released
    assert (out / LEDGER_FILE).read_bytes() == ledger
    outcome = resume(out)
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon


def test_a_ledger_of_one_line_a_round_still_replays(tmp_path, reference):
    """What the previous version wrote for ADADP: each round's two events on its round line."""
    out = simulate(_config(), tmp_path / "run").out_dir
    rows = read_rows(out / LEDGER_FILE)
    merged = [rows[0]]
    for partial, whole in zip(rows[1::2], rows[2::2], strict=True):
        merged.append({**whole, "released": [{**whole["released"][0], "count": 2}]})
        assert partial["kind"] == "partial"
    (out / LEDGER_FILE).write_text("".join(json.dumps(r) + "\n" for r in merged))
    (out / CHECKPOINT).unlink()  # from round 2's checkpoint: round 3 is replayed
    (out / "summary.json").unlink()
    outcome = resume(out)
    assert torch.equal(outcome.params, reference.params)
    assert outcome.epsilon == reference.epsilon
    assert len(read_rows(out / LEDGER_FILE)) == 4  # nothing charged again


def test_a_partial_line_in_a_strategy_that_releases_rounds_whole_is_refused(tmp_path):
    out = simulate(small_config(**{"num-server-rounds": 2}), tmp_path / "run").out_dir
    rows = read_rows(out / LEDGER_FILE)
    rows[1]["kind"] = "partial"
    (out / LEDGER_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / CHECKPOINT).unlink()
    (out / PREVIOUS_CHECKPOINT).unlink(missing_ok=True)
    (out / "summary.json").unlink()
    with pytest.raises(ValueError, match="line 2: a partial release of round 1, but strategy"):
        resume(out)


def test_distributed_shares_under_fixed_sampling_are_calibrated_to_the_cohort(tmp_path):
    """Found by the mechanisms reviewer: every fixed-size cohort has exactly m users, so the
    quantile of its size is m. The default was Binomial(N, q)'s 1% quantile (1 for a cohort of 4
    here), and each share, so the sum's noise, was sqrt(4/1) = 2 times what the accountant was
    told (noise_std 0.25 for 0.125)."""
    one = {"num-server-rounds": 1, "sampling": "fixed"}
    server = simulate(small_config(**one), tmp_path / "server")
    shared = simulate(small_config(**one, **{"noise-mode": "distributed"}), tmp_path / "shares")
    assert shared.rows[-1]["noise_std"] == pytest.approx(server.rows[-1]["noise_std"])
    assert shared.epsilon == server.epsilon


def test_compare_tune_grid_gives_a_rows_composed_epsilon_in_summary_csv(
    tmp_path, capsys, monkeypatch
):
    """Found by the results reviewer: a row of n tunings (one per seed) costs their composition,
    which report.md's notes gave, while summary.csv gave one tuning's epsilon only (11.73 where
    3 tunings compose to 20.65), as compare-tuned's summary.csv did before the same review."""
    drawn, randbits = iter([1, 2]), secrets.randbits  # the tunings' OS-entropy seeds, fixed
    monkeypatch.setattr(secrets, "randbits", lambda k: next(drawn) if k == 63 else randbits(k))
    out = tmp_path / "c"
    argv = ["compare", str(PRESET), "--strategies", "dp-fedavg", "--seeds", "2", "--tune-grid",
            "server-learning-rate=0.5,1", "--mean-trials", "1", "--rounds", "1", "--out",
            str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    with open(out / "summary.csv", encoding="utf-8") as fh:
        (row,) = list(csv.DictReader(fh))
    report = (out / "report.md").read_text(encoding="utf-8")
    noted = re.search(r"^\| dp-fedavg \| 0\.5 \| 2 \| ([0-9.]+) \|$", report, re.M)
    assert noted is not None, report
    composed = float(row["epsilon_tunings_composed"])  # before: no such column
    assert epsilon_text(composed) == noted.group(1)
    assert composed > float(row["epsilon"]) > float(row["epsilon_single_run"])


class _QueryFailsGrid(ScriptedGrid):
    """Every node answers the user query with an error that is not the task's."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            if msg.metadata.message_type != "query":
                return super().send_and_receive(messages, timeout=timeout)
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="no CUDA here")
            replies.append(self._reply(msg, msg.metadata.dst_node_id, error=error))
        return replies


def test_a_flower_run_whose_nodes_host_no_user_is_refused_before_any_round(server_side):
    """The flower reviewer's suggestion: every node failing the user query (a device the nodes
    lack, say) left every user on no node, and the run released noise-only rounds, charged."""
    config = StrategyConfig(
        strategy="dp-fedavg",
        population=POPULATION,
        clients_per_round=4,
        num_server_rounds=2,
        noise_multiplier=0.8,
        clip_norm=1.0,
        seed=5,
    )
    flat, spec = flatten({"w": torch.zeros(DIM)})
    rounds: list = []
    strategy = DPStrategy(
        build_algorithm(config, flat),
        spec,
        node_wait=0.1,
        on_round=lambda result, _: rounds.append(result.round_num),
    )
    with pytest.raises(ValueError, match="none of the 6 connected nodes hosts a user"):
        strategy.start(_QueryFailsGrid({}), flat_to_arrays(flat, spec), 2, timeout=1.0)
    assert rounds == [] and strategy.algorithm.accountant.num_events == 0  # before: [1, 2]


def test_a_compare_report_names_the_public_users_outside_the_guarantee(tmp_path, capsys):
    """Found by the optimizers' reviewer: report.md said "population: 40" and nothing of the
    users whose data built AdaDPS' side information outside the guarantee."""
    out = tmp_path / "c"
    argv = ["compare", str(PRESET), "--strategies", "adadps,dp-fedavg", "--rounds", "1",
            "--set", "side-information.kind=public-users", "--set", "side-information.users=5",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "- population: 40" in report
    assert (
        "- public users (adadps): 5 users' data built the side information outside the "
        "guarantee; they are not in the population ε covers (35 private users)"
    ) in report
    assert "public users (dp-fedavg)" not in report
