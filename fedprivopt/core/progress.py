"""Progress bars on stderr (rich), one construction for every long piece of work.

:func:`stderr_bar` builds and starts the bar that a run's rounds, a tuning's trials, a tuned
comparison's planning and the token store's build show on a terminal: ``LABEL m/n [bar]``, an
optional text field and an optional time remaining. Callers decide when to use it (on a
terminal, unless ``--quiet``) and what to print instead.

The label and the field are shown as plain text, never read as rich's markup. Thirty-fourth
review of issue 15 (outputs, finding 5): a run of a task by reference whose metric is named
``acc[top1]`` showed ``eval_acc=0.6133`` on a terminal (``[top1]`` taken for a style), and text
holding ``[/x]`` (a closing tag) ended the bar's refresh thread in a ``MarkupError`` traceback.

A bar on a terminal hides the cursor until it stops. A process that ends at once while a bar is
shown (a second Ctrl-C, :func:`~fedprivopt.simulation.interrupt.end_now`; a lost Ray head,
:func:`~fedprivopt.simulation.cluster_watch.end_run`) writes :func:`bars_abandoned` first.
Thirty-eighth review of issue 15 (signals, finding 1): ``simulate --engine flower`` on a terminal,
Ctrl-C twice 0.5 s apart (the bar stays while Flower and Ray stop), left the terminal with its
cursor hidden and the one line written at the end of the bar's line.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["SHOW_CURSOR", "bars_abandoned", "stderr_bar"]

SHOW_CURSOR = b"\x1b[?25h"
"""The terminal's control sequence that shows the cursor (rich's ``show_cursor(True)``)."""

_SHOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""The bars started by :func:`stderr_bar`, each with whether it was drawn on a terminal."""


def bars_abandoned() -> bytes:
    """What to write on stderr before the process ends at once, given the bars still shown.

    A bar still shown on a terminal (started and not stopped) has hidden the cursor and left it
    at the end of its line: a line break and the sequence that shows the cursor (``b""`` when
    no such bar is shown). Written raw (``os.write``), as a process ending at once writes its
    line: nothing here takes a lock or draws, so it may be called from a signal handler.
    """
    try:
        shown = any(
            terminal and bool(getattr(getattr(bar, "live", None), "is_started", False))
            for bar, terminal in list(_SHOWN.items())
        )
    except Exception:  # a bar collected meanwhile: nothing to restore for it
        shown = False
    return b"\n" + SHOW_CURSOR if shown else b""


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
    _SHOWN[bar] = bool(bar.console.is_terminal)  # before start: rich then redirects stderr
    bar.start()
    return bar, task
