"""The privacy statements of ``summary.json``: its threat model, what is not covered, its mechanism.

:func:`threat_model` says what the guarantee of a run assumes, :func:`not_covered` what the run's
files hold beyond it (rule 9 of the privacy contract), :func:`mechanism` and
:func:`evaluated_model` the noise mechanism and the model evaluated.
:class:`~fedprivopt.simulation.writer.RunWriter` writes them into ``summary.json``.

Split from :mod:`fedprivopt.simulation.writer`.
"""

from __future__ import annotations

from typing import Any

from fedprivopt.models.side_information_config import ResolvedSideInformation
from fedprivopt.models.task import (
    TASK_SOURCE,
    Task,
    TaskError,
    data_identity,
    private_evaluation_users,
)
from fedprivopt.simulation.config import RunConfig

__all__ = [
    "DISTRIBUTED_VIEW_METRICS",
    "SERVER_VIEW_METRICS",
    "evaluated_model",
    "mechanism",
    "not_covered",
    "threat_model",
    "tuning_trial",
]


def mechanism(s) -> dict[str, Any]:
    """The summary's noise mechanism (and, for tree aggregation, its restart period)."""
    if not s.private:
        return {"noise_mechanism": "none"}
    if not s.tree:
        return {"noise_mechanism": "gaussian"}
    return {"noise_mechanism": "tree", "tree_restart_rounds": s.restart_rounds}


def evaluated_model(config: RunConfig) -> str:
    """The summary's ``evaluated_model``: the last iterate, or the average of the released ones."""
    beta = config.strategy.ema_decay
    if beta <= 0:
        return "the last iterate"
    return (
        f"the exponential moving average (decay {beta:g}) of the released iterates: "
        "post-processing, no privacy cost"
    )


#: Round metrics the server computes from the users' individual updates, without noise.
SERVER_VIEW_METRICS = (
    "cohort_size", "received", "accepted", "rejected", "server_clipped", "clipped_fraction",
    "mean_norm", "shares",
)  # fmt: skip
#: Round metrics that follow the number of accepted shares in distributed-noise mode.
DISTRIBUTED_VIEW_METRICS = ("noise_std", "topup_std", "clip_count_noise_std")


def not_covered(config: RunConfig, task: Task | None = None) -> str | None:
    """What a private run's files hold beyond its guarantee (rule 9 of the privacy contract).

    Twelfth review of issue 15: ``threat_model`` says "every released model (and everything
    computed from them)", while ``metrics.jsonl`` also holds exact counts and norms of the
    sampled users' updates, with nothing saying they are outside ε. Thirty-second review: in
    distributed-noise mode the noise metrics follow the accepted count too, and evaluations of
    users who are also training users (``task.private_evaluation_users()``, e.g. StackOverflow's
    ``test`` split: the training users' later posts) are computed without noise.
    """
    if not config.strategy.private:
        return None
    names = list(SERVER_VIEW_METRICS)
    if config.strategy.noise_mode != "server":
        names += DISTRIBUTED_VIEW_METRICS
    text = (
        f"the round metrics {', '.join(names)} (and their ADADP _1/_2 forms, the Flower "
        "engine's counts of missing users and node errors) in metrics.jsonl and TensorBoard are "
        "the server's exact view of the sampled users and their updates, without noise, and "
        "seconds, the round's wall time, follows the cohort's size and its users' example "
        "counts: epsilon does not cover them"
    )
    if config.engine == "flower":  # forty-fifth review of issue 15 (contract 1)
        text += (
            "; nor the Flower engine's log, which gives each round's cohort size (cohort=), "
            "kept by a deployment in deploy/serverapp.log, whose superlink.log and "
            "supernode-N.log there record which nodes were sent each round's training (with a "
            "node per user, the sampled users)"
        )
    # forty-fourth review of issue 15 (contract 1, 2); the clauses joined by "; " (the privacy
    # follow-up's open row: "...counts)every checkpoint ...", run together)
    clauses = [_data_identity_not_covered(task), _tree_noise_not_covered(config)]
    checkpoints = "; ".join(clause for clause in clauses if clause)
    if checkpoints:
        checkpoints = (
            f". {checkpoints}: epsilon does not cover them, so publish the model's parameters, "
            "not checkpoint.pt, checkpoint.prev.pt or the ledger's header"
        )
    return _evaluations_not_covered(text, task) + checkpoints


def _evaluations_not_covered(text: str, task: Task | None) -> str:
    """``text`` and what it says of the evaluations (``task.private_evaluation_users()``)."""
    private = _private_evaluations(task)
    if private is None:  # forty-second review of issue 15 (contract 2)
        name = type(task).__name__ if task is not None else "the task"
        return text + (
            f"; nor the evaluations (eval_* metrics) if their users are training users: "
            f"{name}.private_evaluation_users() does not say how many are, so this was not "
            "checked; publish the models and epsilon, not these rows, and the evaluations only "
            "if the task evaluates users outside the private population"
        )
    if not private[0]:
        return text + ", so publish the models, epsilon and evaluations, not these rows"
    return text + (
        f"; nor the evaluations (eval_* metrics): {private[0]} of the {private[1]} evaluation "
        "users are training users, evaluated without noise (task-params.eval-split = "
        "'heldout' evaluates users outside the private population), so publish the models "
        "and epsilon, not these rows"
    )


def _data_identity_not_covered(task: Task | None) -> str:
    """The clause on the data identity that the ledger's header and each checkpoint record.

    Forty-fourth review of issue 15 (contract 1): two ``stackoverflow-tp-mini`` runs on copies
    of a dataset that differ in one example of a user neither sampled released bit-identical
    models, but their ledger headers and checkpoints differ in ``users_sha256`` (a SHA-256 of
    every user's example count), from which that user's count comes back in 26 tries to anyone
    who knows the other users' data; ``not_covered`` said to publish "the models". Empty for a
    task whose identity records no data (none, or only its source file's digest).
    """
    if task is None:
        return ""
    try:
        recorded = sorted(k for k in data_identity(task) or {} if k != TASK_SOURCE)
    except (TaskError, OSError, ValueError):  # unknown: the summary is still written
        recorded = ["unknown"]
    if not recorded:
        return ""
    return (
        f"privacy_ledger.jsonl's header and every checkpoint (ledger_header) record the task's "
        f"data identity (data: {', '.join(recorded)}), exact digests of its data files that "
        "every user's data changes, an unsampled user's too (StackOverflow: the SQLite file's "
        "size and a SHA-256 of the users' ids and of every user's example counts, from which "
        "anyone who knows the other users' data recovers one user's counts)"
    )


def _tree_noise_not_covered(config: RunConfig) -> str:
    """The clause on the tree's live node noise that a tree run's checkpoints hold.

    Forty-fourth review of issue 15 (contract 2): ``simulate toy.toml --set
    noise-mechanism=tree --set secure=true --rounds 3``: the noise of round 3's release is
    node (0, 2) of the tree, which ``checkpoint.pt`` holds (``algorithm.tree.noise.nodes``) to
    continue the period; subtracted from the released mean times m (the difference of
    ``checkpoint.pt``'s and ``checkpoint.prev.pt``'s models) it gave round 3's clipped sum
    to 1.6e-7, where the release is 1.48 away, while ``not_covered`` said to publish "the
    models". Empty for the Gaussian mechanism, whose noise no file keeps.
    """
    if config.strategy.noise_mechanism != "tree":
        return ""
    return (
        "every checkpoint of a tree run holds the tree's live nodes (algorithm.tree.noise), "
        "the noise of the period's releases itself (with secure = true too, where no seed "
        "regenerates it): with the models released before it, it gives the exact clipped "
        "sums of the period's rounds"
    )


def _private_evaluations(task: Task | None) -> tuple[int, int] | None:
    """``(private, evaluated)`` of ``task``'s evaluation users; ``None`` when unknown.

    Forty-second review of issue 15 (contract 2): unknown was taken as none private.
    """
    if task is None:
        return None
    try:
        return private_evaluation_users(task)
    except (TaskError, OSError, ValueError):  # unknown: the summary is still written
        return None


def threat_model(config: RunConfig, side: ResolvedSideInformation | None = None) -> str:
    """What the guarantee of ``config``'s run assumes (``summary.json``'s ``threat_model``).

    Forty-second review of issue 15 (contract 1): a seeded run said nothing of its seed, which
    the same file records and which regenerates all noise and every client's share (the
    server derives the clients' seed: docs/DEPLOYMENT.md, "Seeds are secrets").
    Forty-sixth review of issue 15 (contract 1): it named this summary and ``config.toml`` as
    where the seed is recorded, while the ledger's header and every checkpoint hold it too
    (``ledger_header.settings.seed``, ``algorithm.config.seed``): from ``checkpoint.pt`` of a
    seeded toy run alone (a task that records no data identity, whose ``not_covered`` says
    to publish "the models"), regenerating round 1's noise gave its exact clipped sum to
    1.8e-7 (the release is 1.31 away). Forty-seventh review (contract 3, open): each seeded
    stream is one of 2**32 whatever the seed (torch's CPU generator keeps 32 bits of its seed),
    so a search finds the noise without the seed; the text says so.
    """
    s = config.strategy
    if not s.private:
        return "not private: updates are neither clipped nor noised"
    text = "user-level DP of every released model (and of everything computed from them)"
    # forty-second review of issue 15 (contract 6): the relation epsilon is for, as report.md
    # states it (a fixed-size run's epsilon is under replace-one, not add/remove-one)
    if s.tree:
        how = "replaced, dp-accounting's replace-special relation (tree aggregation)"
    elif s.sampling == "fixed":
        how = "replaced (fixed-size sampling: replace-one, sensitivity 2C)"
    else:
        how = "added or removed (Poisson sampling)"
    text += f", neighbouring datasets differing in one user {how}"
    if s.noise_mode == "server":
        text += "; the server is trusted with individual clipped updates"
    else:
        text += (
            "; each update leaves its device carrying a noise share, and the full guarantee "
            "needs min-shares honest shares (the server tops up when fewer arrive)"
        )
    if not s.secure:
        text += (
            f"; seeded (secure = false): the noise and the sampling are derived from seed "
            f"{s.seed} (recorded in this summary, config.toml, privacy_ledger.jsonl's header and "
            "every checkpoint: checkpoint.pt and checkpoint.prev.pt hold it beside the model, so "
            "publish the model's parameters, not those files), so anyone who knows it can "
            "regenerate and subtract the noise: the guarantee holds only while the seed is "
            "secret, and not against a search either: each noise stream is one of 2**32 (torch's "
            "CPU generator keeps 32 bits of its seed), which the released models let anyone "
            "test without the seed; publish runs with secure = true, which draws them from the "
            "operating system's entropy"
        )
        if s.noise_mode != "server":
            text += (
                "; the server derives the seed the clients draw their shares from, so it can "
                "remove them: the shares protect nothing from the server unless secure = true"
            )
    if s.tree:
        text += (
            "; tree aggregation (DP-FTRL, no sampling): fixed cohorts, each user at most once per "
            "restart period (tree_restart_rounds); epsilon assumes the cohort choice does not "
            "depend on the users' data"
        )
    if s.adaptive:
        text += (
            "; adaptive clipping: each user also reports whether its update was clipped, and the "
            "noised count is part of every round's privacy event (sum and count together have "
            f"noise multiplier {s.noise_multiplier:g}); the clip norm is computed from released "
            "counts only"
        )
        if s.noise_mode == "distributed":
            text += (
                "; a report is then a noised share the server cannot check for being 0 or 1, so "
                "a hostile client can move the count by up to 1/2 + 11 times the share's std"
            )
    if s.strategy == "adadps":
        kind = f" ({side.kind})" if side is not None else ""
        text += f"; the side information{kind} must be public: it is not covered by the guarantee"
        if side is not None and side.public_users:
            text += "; " + side.exclusion()
    return text


def tuning_trial(tuning_plan: str | None) -> str:
    """The clause a trial of ``fedprivopt tune`` adds to its ``threat_model`` (else ``""``).

    Forty-sixth review of issue 15 (contract 2): ``tune toy.toml --grid
    server-learning-rate=0.5,1 --mean-trials 1 --rounds 1``: the released trial's own
    ``summary.json`` gave ``epsilon`` 7.551, its run's, and a threat model of "every released
    model", with no word that a tuning chose it, whose release costs 8.279
    (``RepeatAndSelectDpEvent``; the tuning's ``summary.json`` and ``compare-tuned``), where
    ``load_run`` notes such a trial (fortieth review, reports 2). ``tuning_plan``: what the
    run's ledger header names (``tuning_plan``).
    """
    if not tuning_plan:
        return ""
    return (
        "; a trial of a tuning (its privacy_ledger.jsonl names a tuning plan): this summary's "
        "epsilon is its own run's, below what the tuning that chose among its trials spent; "
        "releasing this trial (its model, hyperparameters or score) costs the tuning's "
        "epsilon (the tuning's summary.json; compare-tuned reports it), and releasing any "
        "other trial is not covered"
    )
