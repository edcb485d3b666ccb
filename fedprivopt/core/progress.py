"""Progress bars on stderr (rich), one construction for every long piece of work.

:func:`stderr_bar` builds and starts the bar that a run's rounds, a tuning's trials, a tuned
comparison's planning and the token store's build show on a terminal: ``LABEL m/n [bar]``, an
optional text field and an optional time remaining. Callers decide when to use it (on a
terminal, unless ``--quiet``) and what to print instead.

The label and the field are shown as plain text, never read as rich's markup. Thirty-fourth
review of issue 15 (outputs, finding 5): a run of a task by reference whose metric is named
``acc[top1]`` showed ``eval_acc=0.6133`` on a terminal (``[top1]`` taken for a style), and text
holding ``[/x]`` (a closing tag) ended the bar's refresh thread in a ``MarkupError`` traceback.
"""

from __future__ import annotations

from typing import Any

__all__ = ["stderr_bar"]


def stderr_bar(
    label: str,
    total: int,
    *,
    field: str | None = None,
    completed: int = 0,
    transient: bool = False,
    time_remaining: bool = False,
) -> tuple[Any, Any]:
    """Start a rich progress bar on stderr and return ``(bar, task)``.

    Parameters
    ----------
    label : str
        Shown before the ``m/n`` count.
    total : int
        The count the bar runs to.
    field : str or None
        Name of a text field shown after the bar (``bar.update(task, **{field: text})``),
        initially empty.
    completed : int
        Where the bar starts (a resumed run).
    transient : bool
        Remove the bar when it stops.
    time_remaining : bool
        Show rich's estimate of the time remaining.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(label, markup=False), MofNCompleteColumn(), BarColumn()]
    if field is not None:
        columns.append(TextColumn(f"{{task.fields[{field}]}}", markup=False))
    if time_remaining:
        columns.append(TimeRemainingColumn())
    bar = Progress(*columns, console=Console(stderr=True), transient=transient)
    fields = {} if field is None else {field: ""}
    task = bar.add_task(label, total=total, completed=completed, **fields)
    bar.start()
    return bar, task
