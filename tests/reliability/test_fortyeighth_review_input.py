"""Issue 15, forty-eighth hostile review (input: bad input and the files a command reads): tests.

1. ``compare-tuned T --out R`` (also ``compare`` reusing its runs, ``compare-tuned T --untuned
   D``) where a run's ``summary.json`` names its ``primary_metric`` as a list or a table (a
   summary edited by hand: ``["eval_accuracy"]``, ``{}``). Before: a ``TypeError: unhashable
   type: 'list'`` traceback, rc 1, from ``rundata_aggregate.choose_metric``'s set of the names.
   Now a name that is not text counts as none (as a run written before summaries named it):
   the report takes the preferred metric, rc 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from fedprivopt.simulation.rundata_aggregate import choose_metric


@dataclass
class _Run:
    """The two members of a RunData that choose_metric reads."""

    summary: dict = field(default_factory=dict)
    metrics: tuple = ("eval_accuracy", "eval_loss")

    def has_metric(self, name: str) -> bool:
        return name in self.metrics


@pytest.mark.parametrize("named", [["eval_accuracy"], {}, {"a": 1}, [1]])
def test_1_a_primary_metric_that_is_not_text_is_read_as_none(named):
    runs = [_Run({"primary_metric": named}), _Run({"primary_metric": "eval_accuracy"})]
    assert choose_metric(runs) == "eval_accuracy"
    assert choose_metric([_Run({"primary_metric": named})]) == "eval_accuracy"
