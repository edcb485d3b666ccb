"""Issue 15, thirty-ninth review: the lead's findings.

1. (left open by the thirty-eighth review) every ``simulate --engine flower`` run, ``--quiet`` ones
   too, ended with one line per Ray actor on stderr, ``(ClientAppActor pid=N) WARNING :
   Manually terminating ClientAppActor``: Flower's actor logs it when the engine ends it, and
   Ray forwards it to the command. ``core.logs.hide_engine_notices`` drops that record too;
   ``clients.client_app.make_client_app`` calls it, so the actors (which load the client app)
   install the filter. Flower's other warnings still print. End to end:
   ``tests/reliability/test_signals.py::test_a_normal_flower_run_leaves_no_process_behind``
   (a ``--quiet`` Flower run's stderr is empty).
"""

import logging

from fedprivopt.core.logs import ACTOR_EXIT
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
