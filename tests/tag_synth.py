"""A small synthetic StackOverflow tag task shared by the cohort trainer's tests."""

from __future__ import annotations

from fedprivopt.models import StackOverflowTagTask

SYNTH = dict(synth_clients=300, synth_vocab=600, synth_tags=20, synth_seed=3)


def make_synth_dir(tmp_path_factory, name: str):
    """A directory with the small synthetic dataset generated into it."""
    root = tmp_path_factory.mktemp(name)
    StackOverflowTagTask(data_dir=str(root), vocab_size=500, num_tags=15, **SYNTH)
    return root


def tag_task(root, **kw) -> StackOverflowTagTask:
    """The task over ``root`` (500 words, 15 tags, 80 users), ``kw`` overriding."""
    args = dict(data_dir=str(root), vocab_size=500, num_tags=15, num_users=80, eval_users=5)
    return StackOverflowTagTask(**{**args, **SYNTH, **kw})
