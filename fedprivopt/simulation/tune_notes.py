"""What a tuning's ε covers, in words: the notes of ``fedprivopt tune`` and ``compare-tuned``.

:func:`privacy_note` says what the tuning's two ε cover, :func:`seed_note` what they assume of the
tuning seed, and :func:`selection_note` whether the selection of the released trial (on the
task's evaluation) is covered: :func:`selection_users` counts the task's evaluation users that
are in the private population, and :func:`selection_lines` is ``compare-tuned``'s note on the
tunings whose selection ε does not cover. :data:`TUNED_SUFFIX` marks a tuned row's strategy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedprivopt.simulation.tune import PrivacyPlan

__all__ = [
    "TUNED_SUFFIX",
    "privacy_note",
    "public_users_note",
    "seed_note",
    "selection_lines",
    "selection_note",
    "selection_users",
]

TUNED_SUFFIX = " (tuned)"


def privacy_note(plan: PrivacyPlan) -> str:
    """What the two ε cover, in words (summary and report).

    Forty-second review of issue 15 (contract 4): it named the tuning seed as the operator's
    secret but not the trials' run seeds that ``summary.json`` (``best.seed``, ``trials``) and
    ``trials.csv`` list, each of which regenerates a seeded run's noise (the released one's too).
    Forty-fourth review follow-up (privacy, open for contract): it said "the release of the best
    trial only (its model, hyperparameters and score)" and nothing of the trial's checkpoints and
    ledger header, which its own ``summary.json`` says are not covered (contract 1 and 2).
    """
    runs_acc = plan.accountant
    text = (
        "epsilon covers the whole tuning procedure: a random number of trials drawn from the "
        "stated distribution, each within the single run's ledger, and the release of the best "
        "trial only (its model, hyperparameters and score), computed by dp-accounting's RDP "
        "accountant on RepeatAndSelectDpEvent (Papernot & Steinke, ICLR 2022). It does not cover "
        "publishing the other trials, their number, the released trial's number (trial-NNN: "
        "at least NNN trials ran) or the tuning seed (anyone who knows the seed knows the number "
        "of trials): those stay with the operator; so do the trials' run seeds (trials.csv, "
        "best.seed) of seeded runs (secure = false), from which a run's noise and sampling are "
        "regenerated, the released trial's too. Nor does it cover the released trial's "
        "files beyond its model's parameters: its checkpoint.pt, checkpoint.prev.pt and "
        "ledger header record the data's identity (and a tree run's checkpoints its noise), as "
        "its own summary.json's not_covered says. epsilon_single_run is "
        "one run's epsilon by the same RDP accountant. The selection score is the task's final "
        "evaluation, on the task's evaluation data, which is not accounted."
    )
    if runs_acc != "rdp":
        text += (
            f" The runs account with {runs_acc}; dp-accounting supports RepeatAndSelectDpEvent "
            f"only under RDP, so the tuning epsilon is RDP (single_run.epsilon gives the run's "
            f"own {runs_acc} value)."
        )
    if plan.target_epsilon is not None:
        text += (
            f" The preset's target epsilon {plan.target_epsilon:g} applies to each single run "
            "(which stops before exceeding it), not to the whole tuning."
        )
    return text + _relation_note(plan)


_RELATIONS = {  # the words of a run's threat_model and of compare's report
    "ADD_OR_REMOVE_ONE": "added or removed (Poisson sampling)",
    "REPLACE_ONE": "replaced (fixed-size sampling)",
    "REPLACE_SPECIAL": "replaced, dp-accounting's replace-special relation (tree aggregation)",
}


def _relation_note(plan: PrivacyPlan) -> str:
    """The neighbouring relation of the single run's ledger, as each run's summary names it.

    Forty-fourth review of issue 15 (contract 3): a tuning of fixed-size runs (epsilon 24.53,
    under replace-one) said nothing of its relation in ``summary.json`` or ``report.md``,
    where its trials' ``threat_model`` and ``compare``'s report name it.
    """
    ledger = plan.ledger or ()
    names = {getattr(event.neighboring_relation, "name", "") for event, _ in ledger}
    hows = [_RELATIONS[n] for n in _RELATIONS if n in names]
    if not hows:
        return ""
    return (
        " The unit of privacy is the user; neighbouring datasets differ in one user, "
        + "; or ".join(hows)
        + "."
    )


def public_users_note(summary: Mapping[str, Any] | None) -> str:
    """The public users whose data built the released trial's side information, if any.

    ``summary`` is the released trial's ``summary.json`` (``None``: no trial released).
    Forty-fourth review of issue 15 (contract 3): ``tune --strategy adadps --set
    side-information.kind=public-users`` said that epsilon covers "the release of the best
    trial only (its model, ...)", with no word that 4 users' data built that model's side
    information outside the guarantee, as the trial's ``summary.json`` and ``compare``'s
    report say. Forty-seventh review (reports, finding 5): a trial whose ``summary.json``'s
    ``public_users`` was edited to ``5`` ended ``tune`` (reusing it) in a ``TypeError`` after
    the tuning's ``summary.json`` was removed; one that lists none beside a configuration of
    public users had no note.
    """
    side = (summary or {}).get("side_information")
    users = side.get("public_users") if isinstance(side, Mapping) else None
    if not isinstance(users, list) or not users:  # forty-seventh review (reports, finding 5)
        config = (summary or {}).get("config")
        config = config if isinstance(config, Mapping) else {}
        kind = config.get("side-information")
        kind = kind.get("kind") if isinstance(kind, Mapping) else None
        if config.get("strategy") != "adadps" or kind != "public-users":
            return ""
        return (
            " The released trial's configuration sets side-information.kind = public-users, "
            "while its summary.json lists no public users: their data may have built its side "
            "information outside the guarantee, and they would not be in the population "
            "epsilon covers."
        )
    return (
        f" {len(users)} public users' data built the released trial's side "
        "information outside the guarantee (side-information.kind = public-users): they are "
        f"not in the population epsilon covers ({side.get('private_population')} private users)."
    )


def selection_users(tasks) -> dict | None:
    """Whether the selection on ``tasks``' evaluation reads private users' data.

    ``{"private": k, "evaluated": n}``, the largest overlap over ``tasks`` (the tasks of every
    grid point), or ``None`` when a task does not say (not checked). ``tune`` refuses ``k > 0``
    without ``--selection-on-private-users``; ``compare-tuned`` states it again.
    """
    from fedprivopt.models.task import private_evaluation_users

    worst = {"private": 0, "evaluated": 0}
    for task in tasks:
        _refuse_uncallable(task)
        found = private_evaluation_users(task)
        if found is None:
            return None
        if (found[0], found[1]) > (worst["private"], worst["evaluated"]):
            worst = {"private": found[0], "evaluated": found[1]}
    return worst


def _refuse_uncallable(task: object) -> None:
    """Raise ``TaskError`` when ``task.private_evaluation_users`` is there but no method.

    Forty-sixth review of issue 15 (flags 1): it was read as absent (not checked) unless
    callable, so a task of one's own that wrote it as an attribute
    (``private_evaluation_users = (40, 40)``: all 40 evaluation users are training users)
    was tuned with rc 0, the released trial selected on 40 private users' data without
    ``--selection-on-private-users``, where the method saying the same is refused.
    """
    from fedprivopt.core.text import shown
    from fedprivopt.models.task import TaskError
    from fedprivopt.models.task_calls import task_attribute

    member = task_attribute(task, "private_evaluation_users")  # its own error named (outputs 4)
    if member is not None and not callable(member):
        raise TaskError(
            f"{type(task).__name__}.private_evaluation_users must be a method returning "
            f"(private, evaluated), got {shown(member)}"
        )


def selection_lines(checks: Sequence[Any]) -> list[str]:
    """``compare-tuned``'s note on tunings whose selection ε does not cover; nothing if none.

    ``checks`` are :func:`~fedprivopt.simulation.tune_check.check_tunings`' results, whose
    ``selection`` was recomputed from their tasks.

    Thirty-fifth review of issue 15 (tuning, finding 2): ``compare-tuned`` of a tuning run with
    ``--selection-on-private-users`` (91 of the task's 100 evaluation users private) said its
    row's epsilon is that of the whole tuning procedure, with no word that the selection read
    private users' data without noise (the tuning's own report says so).
    """
    from fedprivopt.simulation.report_format import plain_text

    lines = []
    for check in checks:
        selection = check.selection
        if selection is not None and not selection.get("private"):
            continue
        name = check.plan["strategy"] + TUNED_SUFFIX
        # forty-seventh review (tuning, finding 5): the path as plain text, not Markdown or HTML
        lines.append(f"- {plain_text(check.path)} ({name}): {selection_note(selection)}")
    if not lines:
        return []
    heading = "**Tuned rows whose epsilon does not (or may not) cover their selection:**"
    return ["", heading, "", *lines]


def selection_note(selection: Mapping[str, Any] | None) -> str:
    """Whether the selection (on the task's evaluation) is covered by the tuning's ε, in words.

    Parameters
    ----------
    selection : Mapping or None
        ``{"private": k, "evaluated": n}`` (``k`` of the ``n`` evaluation users are training
        users), or ``None`` when the task does not say (not checked).
    """
    if selection is None or selection.get("private") is None:
        return (
            "Selection: not checked. The task does not say whether its evaluation users are in "
            "the private population; if they are, the selection is not covered by epsilon."
        )
    k, n = selection["private"], selection["evaluated"]
    if n == 0:
        # thirty-eighth review of issue 15 (reports, finding 4): "None of the task's 0
        # evaluation users is in the private population (checked by client id)" of the toy
        # task, whose test set belongs to no user: no id was checked, and "0 evaluation users"
        # read as if the selection had evaluated nothing
        return (
            "Selection: covered. The task's evaluation data belongs to no user (the task draws "
            "it apart from every user), so the selection reads no private user's data."
        )
    if k == 0:
        return (
            f"Selection: covered. None of the task's {n} evaluation users is in the private "
            "population (checked by client id), so the selection reads no private user's data."
        )
    return (
        f"Selection: NOT covered by epsilon. {k} of the task's {n} evaluation users are in the "
        "private population (given --selection-on-private-users): the choice of the released "
        "trial and its score depend, without noise, on their data, so epsilon does not bound "
        "what the release says about them (select on eval-split heldout instead)."
    )


def seed_note(secret: bool) -> str:
    """What the ε assumes of the tuning seed, in words."""
    if secret:
        return (
            "Tuning seed: drawn from OS entropy and recorded only in the operator's tune.json; "
            "epsilon assumes it, the number of trials and the other trials stay secret."
        )
    return (
        "Tuning seed: given with --seed. epsilon assumes that seed stays secret: anyone who knows "
        "it knows the number of trials, and then the Papernot-Steinke bound does not apply."
    )
