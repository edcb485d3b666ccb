"""Issue 15, thirty-ninth review: the lead's findings.

1. (left open by the thirty-eighth review) every ``simulate --engine flower`` run, ``--quiet`` ones
   too, ended with one line per Ray actor on stderr, ``(ClientAppActor pid=N) WARNING :
   Manually terminating ClientAppActor``: Flower's actor logs it when the engine ends it, and
   Ray forwards it to the command. ``core.logs.hide_engine_notices`` drops that record too;
   ``clients.client_app.make_client_app`` calls it, so the actors (which load the client app)
   install the filter. Flower's other warnings still print. End to end: the ``--quiet`` resume
   of ``tests/reliability/test_signals.py``'s flower-SIGINT run (no such line on its stderr).
2. (the reports reviewer's open row) every line and report showed ε rounded to the nearest
   shown digit: ``compare toy.toml --strategies dp-fedavg --rounds 2 --set accountant=pld``
   spent 8.961188 and showed ``8.961``, below what was spent (``calibrate`` already rounded its
   σ up so that the shown value keeps its promise). ``core.text.epsilon_text`` rounds up from
   the float's shortest decimal: ``8.962``; the ``epsilon`` command's four places alike
   (0.00350149… is ``0.0036``: ``test_thirtyfirst_review_privacy.py::test_1_epsilon_command``).
   ``summary.json`` and ``summary.csv`` keep every digit.
"""

import logging
import math

import pytest

from fedprivopt.core.logs import ACTOR_EXIT
from fedprivopt.core.text import epsilon_text
from tests.reliability.test_thirtyeighth_review_lead import _Records


def test_1_the_client_app_drops_the_actors_exit_line_and_no_other_warning():
    from flwr.supercore import log

    from fedprivopt.clients.client_app import make_client_app

    flower = logging.getLogger("flwr")
    records = _Records()
    flower.addHandler(records)
    saved = list(flower.filters)
    try:
        for f in saved:
            flower.removeFilter(f)
        log(logging.WARNING, ACTOR_EXIT, "ClientAppActor")
        assert records.lines == ["Manually terminating ClientAppActor"]  # before: it printed
        make_client_app()
        log(logging.WARNING, ACTOR_EXIT, "ClientAppActor")
        log(logging.WARNING, "Manually terminating %s", "ClientAppActor")
        log(logging.WARNING, "a warning of a user's ClientApp")
    finally:
        flower.removeHandler(records)
        for f in list(flower.filters):
            flower.removeFilter(f)
        for f in saved:
            flower.addFilter(f)
    assert records.lines == [
        "Manually terminating ClientAppActor",
        "a warning of a user's ClientApp",
    ]


@pytest.mark.parametrize(
    "value, shown, places",
    [
        (8.961188, "8.962", "8.9612"),  # before: 8.961
        (13.860004, "13.87", "13.8601"),  # before: 13.86 and 13.8600
        (0.00350149603974521, "0.003502", "0.0036"),  # the epsilon command: before 0.0035
        (7.550846730098353, "7.551", "7.5509"),
        (12.17, "12.17", "12.1700"),  # a float just below 12.17 is shown as written
        (0.1, "0.1", "0.1000"),
        (2.0, "2", "2.0000"),
        (1e-7, "1e-07", "0.0001"),
        (1.5e298, "1.5e+298", None),
        (1.7976931348623157e308, "1.798e+308", None),  # above every float: not "inf"
        (0.0, "0", "0.0000"),
        (math.inf, "inf", "inf"),
    ],
)
def test_2_a_shown_epsilon_is_never_below_the_epsilon(value, shown, places):
    assert epsilon_text(value) == shown
    if places is not None:
        assert epsilon_text(value, places=4) == places
    if math.isfinite(value):
        assert float(shown) >= value or shown == "1.798e+308"
