r"""Token ids of the next-word task: the special tokens and the encoding of sentences.

How :class:`~fedprivopt.models.next_word.StackOverflowNextWordTask` turns an example's ``tokens``
into model inputs and targets, exactly as TFF's ``word_prediction_preprocessing`` [1]_ does.

Token ids (TFF's convention)
----------------------------
With ``V`` the number of vocabulary words (the top ``V`` of ``stackoverflow.word_count``):

======  ==============  ===============================================
id      token           note
======  ==============  ===============================================
0       pad             fills sequences shorter than ``seq_len + 1``
1..V    the words       word of popularity rank ``r`` (0-based) is ``r + 1``
V + 1   oov             every out-of-vocabulary word (one bucket)
V + 2   bos             beginning of sentence, first input of every example
V + 3   eos             end of sentence
======  ==============  ===============================================

so the model scores ``V + 4`` tokens (:func:`special_tokens`). An example's ``tokens`` string is
split on whitespace, cut to its first ``seq_len`` words and mapped to ids; ``eos`` is appended
only when fewer than ``seq_len`` words remain, ``bos`` is prepended, and the sequence is padded
to ``seq_len + 1`` ids. The input is ``x = ids[:-1]`` and the target ``y = ids[1:]`` (both of
length ``seq_len``, 20 by default): exactly TFF's ``to_ids``, ``padded_batch`` and
``split_input_target``. ``bos`` never occurs as a target, ``pad`` only after the sentence.

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.baselines.stackoverflow.create_word_prediction_task``
   and its ``word_prediction_preprocessing``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from fedprivopt.core.checks import check_int

__all__ = ["PAD", "SpecialTokens", "encode_sentences", "special_tokens", "to_ids"]

PAD = 0


class SpecialTokens(NamedTuple):
    """Ids of the special tokens for a vocabulary of ``V`` words (see the module docstring).

    Attributes
    ----------
    pad, oov, bos, eos : int
        ``0``, ``V + 1``, ``V + 2`` and ``V + 3``.
    """

    pad: int
    oov: int
    bos: int
    eos: int


def special_tokens(vocab_size: int) -> SpecialTokens:
    """The special-token ids for ``vocab_size`` words; the model scores ``vocab_size + 4``."""
    v = check_int("vocab_size", vocab_size, 1)
    return SpecialTokens(pad=PAD, oov=v + 1, bos=v + 2, eos=v + 3)


def to_ids(tokens: str, word_index: dict[str, int], *, seq_len: int) -> list[int]:
    """Ids of one sentence: ``[bos] + words[:seq_len] (+ [eos])``, unpadded.

    Parameters
    ----------
    tokens : str
        The example's space-separated words.
    word_index : dict of str to int
        Word to id in ``[1, V]`` with ``V = len(word_index)``; any other word is oov (``V + 1``).
    seq_len : int
        Words kept, ``>= 1``; ``eos`` is appended only when the sentence has fewer (TFF's rule),
        so the result has at most ``seq_len + 1`` ids.

    Returns
    -------
    list of int
    """
    seq_len = check_int("seq_len", seq_len, 1)
    specials = special_tokens(len(word_index))
    words = tokens.split()[:seq_len]
    ids = [specials.bos, *(word_index.get(w, specials.oov) for w in words)]
    if len(words) < seq_len:
        ids.append(specials.eos)
    return ids


def encode_sentences(
    sentences: Sequence[str], word_index: dict[str, int], *, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode sentences as padded inputs and next-word targets.

    Parameters
    ----------
    sentences : sequence of str
        The ``tokens`` strings, one per example.
    word_index : dict of str to int
        Word to id in ``[1, V]`` (see :func:`to_ids`).
    seq_len : int
        Sequence length ``>= 1``.

    Returns
    -------
    x, y : torch.Tensor
        ``int64`` ``(n, seq_len)`` each: ``ids[:-1]`` and ``ids[1:]`` of the ids of
        :func:`to_ids` padded with ``0`` to ``seq_len + 1``.
    """
    seq_len = check_int("seq_len", seq_len, 1)
    ids = torch.zeros(len(sentences), seq_len + 1, dtype=torch.int64)
    for i, sentence in enumerate(sentences):
        row = to_ids(sentence, word_index, seq_len=seq_len)
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
