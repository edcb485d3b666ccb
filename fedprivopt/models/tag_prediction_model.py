r"""The tag-prediction model: logistic regression over bags of words, and its metric counts.

:class:`BagOfWordsLogisticRegression` is the model of
:class:`~fedprivopt.models.tag_prediction.StackOverflowTagTask`; :func:`tag_metrics` counts the
top-``k`` hits of its scores, which the task sums over its evaluation batches.

Model
-----
:class:`BagOfWordsLogisticRegression` computes ``logits = features @ weight + bias`` with
``weight`` of shape ``(V, K)`` (row ``j`` = word ``j``; note: the transpose of
``torch.nn.Linear``'s layout) and ``bias`` of shape ``(K,)``; its state dict holds exactly these
two tensors, so the flat layout is ``weight.reshape(-1)`` (word ``j`` at ``[j K, (j + 1) K)``)
followed by ``bias``. The forward pass uses ``embedding_bag`` over the word-id tensors of
:mod:`~fedprivopt.models.tag_prediction_encoding` and never builds the dense ``(n, V)`` input.

Metric counts
-------------
Keras' ``Recall(top_k=5)``/``Precision(top_k=5)`` in TFF count hits among the 5 top-scored tags;
:func:`tag_metrics` returns these counts (and the top-1 hits), summed rather than averaged, so
that batches add up before the one division.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedprivopt.models.tag_prediction_encoding import bag_of_words, multi_hot

__all__ = ["TOP_K", "BagOfWordsLogisticRegression", "tag_metrics"]

#: The ``k`` of recall@k and precision@k (Keras' ``top_k=5`` in TFF).
TOP_K = 5
_TOP_K = TOP_K


class BagOfWordsLogisticRegression(torch.nn.Module):
    """Logistic regression on sparse bag-of-words inputs: ``features @ weight + bias``.

    Parameters
    ----------
    vocab_size : int
        ``V``, the number of features.
    num_tags : int
        ``K``, the number of outputs.

    Attributes
    ----------
    weight : torch.nn.Parameter
        ``(V, K)``: row ``j`` holds word ``j``'s scores for every tag.
    bias : torch.nn.Parameter
        ``(K,)``.

    Notes
    -----
    ``forward`` takes the id tensors described in :mod:`fedprivopt.models.tag_prediction_encoding`
    and calls ``embedding_bag`` with per-word weights; its gradient w.r.t. ``weight`` is dense
    (zero outside the rows of the batch's words).
    """

    def __init__(self, vocab_size: int, num_tags: int) -> None:
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.num_tags = int(num_tags)
        self.weight = torch.nn.Parameter(torch.zeros(self.vocab_size, self.num_tags))
        self.bias = torch.nn.Parameter(torch.zeros(self.num_tags))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, K)`` of the word-id tensor ``x`` ``(n, L)``."""
        ids, weights = bag_of_words(x, self.vocab_size)
        bags = F.embedding_bag(
            ids, self.weight, per_sample_weights=weights.to(self.weight.dtype), mode="sum"
        )
        return bags + self.bias

    def extra_repr(self) -> str:
        """Sizes shown by ``repr``."""
        return f"vocab_size={self.vocab_size}, num_tags={self.num_tags}"


def tag_metrics(scores: torch.Tensor, y: torch.Tensor, *, k: int = _TOP_K) -> dict[str, float]:
    """Summed (not averaged) top-``k`` hit counts of ``scores`` ``(n, K)`` against labels ``y``.

    Parameters
    ----------
    scores : torch.Tensor
        Logits ``(n, K)``.
    y : torch.Tensor
        Single labels ``(n,)`` or padded tag ids ``(n, T)`` (padding ``K``).
    k : int
        Cut-off of recall/precision (``min(k, K)`` is used).

    Returns
    -------
    dict
        ``"hits"`` (true tags among the top ``k``), ``"true"`` (number of true tags), ``"top1"``
        (examples whose top-scored tag is true) and ``"n"``: divide as ``recall = hits / true``,
        ``precision = hits / (k n)``, ``accuracy = top1 / n``.
    """
    n, num_tags = scores.shape
    kk = min(k, num_tags)
    top = scores.topk(kk, dim=1).indices
    if y.dim() == 1:
        truth = F.one_hot(y, num_tags).to(torch.bool)
    else:
        truth = multi_hot(y, num_tags).to(torch.bool)
    hits = truth.gather(1, top)
    return {
        "hits": float(hits.sum()),
        "true": float(truth.sum()),
        "top1": float(hits[:, 0].sum()) if kk else 0.0,
        "n": float(n),
        "k": float(kk),
    }
