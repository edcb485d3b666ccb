"""Issue 15, forty-seventh hostile review (reports: compare, tune, compare-tuned, reports): tests.

1. ``compare toy.toml --strategies dp-fedavg,fedavg --rounds 3 --seeds 2`` (also two private
   rows of one run each). Before: ``privacy_utility.png`` drew dp-fedavg's mean over its 2
   seeds at one run's ε, 12.17, under "ε (at δ=0.0001)", while publishing it costs their
   composition, 16.29 (the report's "seeds composed" line, ``summary.csv``'s
   ``epsilon_seeds_composed``); two private rows of 7.551 each (10.28 together) alike: the plot
   read alone said nothing. Now ``report_plots._composition_text`` says so on the ε axis.
2. ``compare toy.toml --strategies dp-fedavg --rounds 1 --set task="m:Ref"``, a task by reference
   whose ``reference()`` model is named ``prior\n## Privacy parameters\n\n- noise: none\n\n
   ![x](http://evil.example/t.png)`` (also its ``initialization`` text, the "Initial model:"
   line). Before: ``report.md`` held three headings ``## Privacy parameters`` of the name's own,
   a list item ``- noise: none`` and an image of another address (fetched when the report is
   shown). Now the name is written by ``report_format.plain_text`` (one line; brackets and
   ``<`` escaped).
3. ``write_report(out, load_runs(R))`` (also ``compare`` reusing the cell) of an adadps run with
   ``side-information.kind = "public-users"`` (4 public users) whose ``summary.json`` lost its
   ``side_information`` entry; also that entry's ``public_users`` edited to ``5``, or the
   ``reference`` to ``"x"``. Before: the report's "public users" line was left out without a
   word (``config.toml`` and the ledger header still set the kind); the edits ended ``compare``
   and ``compare-tuned --untuned`` in a ``TypeError`` or ``AttributeError`` traceback after the
   earlier report was removed. Now ``report_markdown._public_users`` says what the
   configuration sets, and a public-users entry or reference that is not what a run writes is
   read as none.
4. ``write_report(out, [load_run(R)])`` of a dp-fedavg run of a task that evaluates 3 of its 5
   evaluation users among its training users, whose ``summary.json`` lost its ``not_covered``
   (edited, or written before the text was). Before: ``summary.csv``'s ``evaluations_covered``
   ``yes`` and no "Evaluations:" line, as for a task whose evaluation users are apart. Now a
   private run whose summary says nothing is one whose evaluations ε may not cover
   (``rundata_aggregate.evaluations_outside``): ``no``, and the line.
5. ``tune toy.toml --strategy adadps --grid server-learning-rate=0.5,1 --mean-trials 1 --rounds 1
   --seed 1 --set side-information.kind=public-users --set side-information.users=4``, the
   released trial's ``summary.json``'s ``public_users`` edited to ``5`` (or the entry lost), then
   the same command (reusing the trial). Before: a ``TypeError`` traceback, after the tuning's
   ``summary.json`` and ``report.md`` were removed (``compare-tuned``: "not a finished tuning");
   a lost entry left the public users out of the tuning's privacy text. Now
   ``tune_notes.public_users_note`` reads a list alone and, without one, says what the trial's
   configuration sets.
6. ``compare toy.toml --strategies adadps,dp-fedavg --rounds 1 --set
   side-information.kind=public-users --set side-information.users=4``, ``summary.csv`` read
   alone. Before: the adadps row at ε 7.712 beside dp-fedavg's with no word of the 4 users whose
   data built its side information outside the guarantee (only ``report.md``'s "public users"
   line). Now the column ``public_users`` gives their number (``configured`` where a summary
   lists none; empty for none).
"""

from __future__ import annotations

import math
import re

from fedprivopt.simulation import report_plots
from fedprivopt.simulation.report import aggregate_runs
from fedprivopt.simulation.report_format import plain_text
from fedprivopt.simulation.report_markdown import markdown
from fedprivopt.simulation.rundata import RunData
from fedprivopt.simulation.rundata_aggregate import (
    aggregate_with_notes,
    reference_model,
    select_runs,
)


def _run(tmp_path, strategy: str, sigma: float, seed: int = 0, eps: float = 7.551) -> RunData:
    """A finished 2-round toy run's data (private at ε ``eps``, or a non-private baseline)."""
    private = sigma > 0
    config = {"strategy": strategy, "noise-multiplier": sigma, "sampling": "poisson",
              "accountant": "rdp", "delta": 1e-4, "seed": seed}  # fmt: skip
    summary = {"strategy": strategy, "noise_multiplier": sigma, "seed": seed,
               "epsilon": eps if private else math.inf, "delta": 1e-4,
               "rounds_completed": 2, "config": config}  # fmt: skip
    rows = [{"round": r, "eval_accuracy": 0.5 + seed / 100, "eval_loss": 0.9} for r in (1, 2)]
    path = tmp_path / f"{strategy}__sigma{sigma:g}__seed{seed}"
    return RunData(summary, rows, path, ledger_epsilon=eps if private else None)


def _epsilon_axis(monkeypatch, tmp_path, runs) -> str:
    """The ε axis' label of the privacy-utility plot of ``runs``."""
    seen = []
    monkeypatch.setattr(report_plots, "_finish",
                        lambda fig, ax, path, n: seen.append(ax.get_xlabel()))  # fmt: skip
    report_plots.draw_privacy_utility(aggregate_runs(runs), tmp_path / "p.png")
    return seen[0]


def test_1_a_row_over_seeds_is_not_drawn_as_one_runs_cost(monkeypatch, tmp_path):
    seeds = [_run(tmp_path, "dp-fedavg", 0.5, s) for s in (0, 1)]
    label = _epsilon_axis(monkeypatch, tmp_path, [*seeds, _run(tmp_path, "fedavg", 0.0)])
    assert "a row over n seeds is drawn at one run's ε" in label, label
    assert "publishing the plot releases" not in label, label
    rows = [_run(tmp_path, "dp-fedavg", 0.5), _run(tmp_path, "dp-fedadam", 0.5)]
    label = _epsilon_axis(monkeypatch, tmp_path, rows)
    assert "publishing the plot releases every row's runs" in label, label
    alone = [_run(tmp_path, "dp-fedavg", 0.5), _run(tmp_path, "fedavg", 0.0)]
    assert _epsilon_axis(monkeypatch, tmp_path, alone) == "ε (at δ=0.0001)"


INJECTED = "prior\n## Privacy parameters\n\n- noise: none\n\n![x](http://evil.example/t.png)"


def test_2_a_reference_or_initialization_text_is_written_as_plain_text(tmp_path):
    run = _run(tmp_path, "dp-fedavg", 0.5)
    run.summary["reference"] = {"name": INJECTED, "metrics": {"eval_accuracy": 0.3}}
    run.summary["initial_model"] = "zeros <img src=http://evil.example/i.png> " + INJECTED
    sel, _ = select_runs([run], None)
    rows, _ = aggregate_with_notes(sel.runs, sel.metric)
    text = markdown("t", sel, rows, [], None, reference_model(sel.runs, sel.metric))
    lines = text.splitlines()
    assert lines.count("## Privacy parameters") == 1, lines  # before: 4
    assert "- noise: none" not in lines and "![x](" not in text, text
    assert re.search(r"(?<!\\)<img", text) is None and "\\<img" in text, text
    assert "Reference: prior\\n## Privacy parameters" in text, text
    assert plain_text("a\\![x](u) <b>") == "a\\\\!\\[x\\](u) \\<b>"  # no link, no HTML
    assert plain_text("zero weights") == "zero weights"


def _adadps(tmp_path, side) -> RunData:
    """An adadps run of 4 configured public users whose summary.json holds ``side``."""
    run = _run(tmp_path, "adadps", 0.5)
    side_config = {"kind": "public-users", "users": 4}
    run.summary["config"].update({"strategy": "adadps", "side-information": side_config})
    if side is not None:
        run.summary["side_information"] = side
    return run


def _report(runs) -> str:
    sel, _ = select_runs(runs, None)
    rows, _ = aggregate_with_notes(sel.runs, sel.metric)
    return markdown("t", sel, rows, [], None, reference_model(sel.runs, sel.metric))


def test_3_public_users_a_summary_does_not_list_are_still_said(tmp_path):
    listed = {"kind": "public-users", "public_users": [0, 1, 2, 3], "private_population": 36}
    assert "- public users (adadps): 4 users' data" in _report([_adadps(tmp_path, listed)])
    for side in (None, {"kind": "public-users", "public_users": 5}):
        text = _report([_adadps(tmp_path, side)])  # before: no line; a TypeError for 5
        assert (
            "- public users (adadps): its summary.json lists none, but its configuration "
            "sets side-information.kind = public-users" in text
        ), text
    auto = _adadps(tmp_path, {"kind": "ones", "requested": "auto"})  # auto resolved: no line
    auto.summary["config"]["side-information"] = {"kind": "auto"}
    assert "- public users" not in _report([auto])
    run = _run(tmp_path, "dp-fedavg", 0.5)
    run.summary["reference"] = "x"  # before: an AttributeError
    assert "Reference:" not in _report([run])


def test_4_a_summary_without_not_covered_does_not_claim_covered_evaluations(tmp_path):
    said = _run(tmp_path, "dp-fedavg", 0.5)
    said.summary["not_covered"] = (
        "the round metrics ..., so publish the models, epsilon and evaluations"
    )
    silent = _run(tmp_path, "dp-fedavg", 0.5, seed=1)  # no not_covered
    for runs, covered in (([said], "yes"), ([said, silent], "no"), ([silent], "no")):
        rows, _ = aggregate_with_notes(runs, None)
        assert rows[0]["evaluations_covered"] == covered, (runs, rows)  # before: yes
        assert ("Evaluations: " in _report(runs)) == (covered == "no")


def test_5_a_tunings_public_users_note_of_an_edited_trial_summary():
    from fedprivopt.simulation.tune_notes import public_users_note

    config = {"strategy": "adadps", "side-information": {"kind": "public-users", "users": 4}}
    listed = {"public_users": [0, 1, 2, 3], "private_population": 36}
    assert public_users_note({"side_information": listed, "config": config}).startswith(" 4 ")
    for side in ({"public_users": 5}, None):  # before: a TypeError; no note
        note = public_users_note({"side_information": side, "config": config})
        assert "sets side-information.kind = public-users" in note, note
    assert public_users_note({"side_information": None, "config": {"strategy": "dp-fedavg"}}) == ""


def test_6_summary_csv_names_the_public_users(tmp_path):
    import csv

    from fedprivopt.simulation.report import write_summary_csv

    listed = {"kind": "public-users", "public_users": [0, 1, 2, 3], "private_population": 36}
    runs = [_adadps(tmp_path, listed), _run(tmp_path, "dp-fedavg", 0.5)]
    rows, _ = aggregate_with_notes(runs, None)
    with write_summary_csv(rows, tmp_path / "s.csv").open(encoding="utf-8") as fh:
        cells = {r["strategy"]: r["public_users"] for r in csv.DictReader(fh)}
    assert cells == {"adadps": "4", "dp-fedavg": ""}, cells  # before: no such column
    rows, _ = aggregate_with_notes([_adadps(tmp_path, None)], None)
    assert rows[0]["public_users"] == "configured"
