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

from fedprivopt.models.next_word import StackOverflowNextWordTask
from fedprivopt.models.next_word_model import NextWordLSTM
from fedprivopt.models.registry import build_task, register_task, task_names
from fedprivopt.models.side_information import (
    public_users_preconditioner,
    token_frequency_preconditioner,
    two_level_preconditioner,
)
from fedprivopt.models.tag_prediction import StackOverflowTagTask
from fedprivopt.models.tag_prediction_model import BagOfWordsLogisticRegression
from fedprivopt.models.task import (
    Task,
    frozen_mask,
    initial_flat,
    model_spec,
    primary_metric,
    state_to_flat,
)
from fedprivopt.models.toy import ToyClassificationTask

__all__ = [
    "BagOfWordsLogisticRegression",
    "NextWordLSTM",
    "StackOverflowNextWordTask",
    "StackOverflowTagTask",
    "Task",
    "ToyClassificationTask",
    "build_task",
    "frozen_mask",
    "initial_flat",
    "model_spec",
    "primary_metric",
    "public_users_preconditioner",
    "register_task",
    "state_to_flat",
    "task_names",
    "token_frequency_preconditioner",
    "two_level_preconditioner",
]
