"""The shared stderr progress bar (``fedprivopt.core.progress``)."""

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from fedprivopt.core.progress import stderr_bar


def test_a_round_bar_has_its_field_its_start_and_the_time_remaining():
    bar, task = stderr_bar("round", 10, field="shown", completed=3, time_remaining=True)
    try:
        kinds = [type(c) for c in bar.columns]
        assert kinds == [TextColumn, MofNCompleteColumn, BarColumn, TextColumn, TimeRemainingColumn]
        assert bar.tasks[0].completed == 3 and bar.tasks[0].total == 10
        bar.update(task, shown="epsilon=1")
        assert bar.tasks[0].fields == {"shown": "epsilon=1"}
        assert not bar.live.transient
    finally:
        bar.stop()


def test_a_plain_bar_has_no_field_and_a_transient_one_goes_away():
    bar, _ = stderr_bar("encoding", 4)
    bar.stop()
    assert len(bar.columns) == 3 and bar.tasks[0].fields == {}
    bar, _ = stderr_bar("checking tunings", 4, field="cell", transient=True)
    bar.stop()
    assert bar.live.transient and bar.tasks[0].fields == {"cell": ""}
