"""Tasks: model architecture, per-user data and held-out evaluation, without Flower.

:class:`Task` is the protocol shared by :class:`fedprivopt.clients.LocalTrainer`, the Flower
ClientApp and the engines; :func:`build_task` rebuilds a registered task from plain parameters
(``"toy"``: :class:`ToyClassificationTask`; ``"stackoverflow-tp"``: :class:`StackOverflowTagTask`,
bag-of-words tag prediction on StackOverflow; ``"stackoverflow-nwp"``:
:class:`StackOverflowNextWordTask`, next-word prediction with TFF's LSTM). :func:`model_spec`
and :func:`initial_flat` give the flat layout and initial point of a task's model,
:func:`frozen_mask` its coordinates that never train;
:func:`two_level_preconditioner`, :func:`token_frequency_preconditioner` and
:func:`public_users_preconditioner` are AdaDPS' public side information
(:mod:`~fedprivopt.models.side_information`).
"""

from fedprivopt.core.lazy import lazy_package

__all__ = lazy_package(
    __name__,
    {
        "next_word": ("StackOverflowNextWordTask",),
        "next_word_model": ("NextWordLSTM",),
        "registry": (
            "build_task",
            "register_task",
            "task_names",
        ),
        "side_information": (
            "public_users_preconditioner",
            "token_frequency_preconditioner",
            "two_level_preconditioner",
        ),
        "tag_prediction": ("StackOverflowTagTask",),
        "tag_prediction_model": ("BagOfWordsLogisticRegression",),
        "task": (
            "Task",
            "frozen_mask",
            "initial_flat",
            "model_spec",
            "primary_metric",
            "state_to_flat",
        ),
        "toy": ("ToyClassificationTask",),
    },
)
