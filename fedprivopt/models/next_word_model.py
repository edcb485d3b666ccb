r"""The next-word model: TFF's embedding-LSTM-projection network, its size and hit counts.

:class:`NextWordLSTM` is the model of
:class:`~fedprivopt.models.next_word.StackOverflowNextWordTask`, :func:`parameter_count` its number
of parameters and :func:`next_word_counts` the top-1 hits of its logits by kind of target (the
task sums them over its evaluation batches).

Model
-----
:class:`NextWordLSTM` is TFF's ``create_recurrent_model`` [1]_: ``Embedding(V + 4, e)`` ->
``LSTM(h)`` (one layer, all time steps) -> ``Linear(h, e)`` (no activation) ->
``Linear(e, V + 4)`` logits, with ``e = 96`` and ``h = 670`` by default. Initialization follows
Keras' defaults, as in TFF, drawn from a generator keyed by the task's seed: embedding
``U(-0.05, 0.05)``, LSTM input weights Glorot-uniform, recurrent weights orthogonal, forget-gate
bias 1 and other biases 0, dense weights Glorot-uniform with zero biases.

Parameters (:func:`parameter_count`): with ``W = V + 4``,
``W e + 4 h (e + h) + 8 h + (h e + e) + (e W + W)``. PyTorch's LSTM has two bias vectors
(``bias_ih`` and ``bias_hh``) where Keras has one, so the count is ``4 h`` larger than TFF's:
**4,053,428** at ``V = 10,000`` against TFF's 4,050,748 (``keras=True``). The redundant bias
(its sum is what matters) is kept because it is PyTorch's (and cuDNN's) layout; only
``bias_ih`` carries the forget-gate 1. The module has no buffers, so its state dict is its
parameters: ``embedding.weight``, ``lstm.{weight_ih,weight_hh,bias_ih,bias_hh}_l0``,
``projection.{weight,bias}``, ``output.{weight,bias}`` in that order (the flat layout of
:func:`fedprivopt.models.model_spec`).

References
----------
.. [1] TensorFlow Federated, ``tff.simulation.baselines.stackoverflow.create_word_prediction_task``
   and its ``word_prediction_models``.
"""

from __future__ import annotations

import torch

from fedprivopt.core.checks import check_int
from fedprivopt.models.next_word_tokens import special_tokens
from fedprivopt.models.uninitialized import materialize

__all__ = ["NextWordLSTM", "next_word_counts", "parameter_count"]

_EMBEDDING_INIT = 0.05  # Keras' Embedding default: uniform(-0.05, 0.05)


class NextWordLSTM(torch.nn.Module):
    """TFF's StackOverflow next-word model: embedding, LSTM, projection, output logits.

    Parameters
    ----------
    num_tokens : int
        ``V + 4``: the embedding's rows and the number of logits, ``>= 5``.
    embedding_dim : int
        ``e``, the embedding and projection width.
    hidden_size : int
        ``h``, the LSTM's width.
    generator : torch.Generator, optional
        Source of the initial weights (:meth:`reset_parameters`); default: a CPU generator
        seeded with 0. The global generator is never used.

    Notes
    -----
    ``forward`` maps ``int64`` ids ``(n, T)`` to logits ``(n, T, V + 4)``; every time step sees
    only the ids before and at it. The layers are created on the ``meta`` device (the embedding
    from an uninitialized weight) and materialized on the CPU
    (:func:`~fedprivopt.models.uninitialized.materialize`), so that PyTorch's default
    initialization (which draws from the global generator) never runs.
    """

    def __init__(
        self,
        num_tokens: int,
        embedding_dim: int,
        hidden_size: int,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.num_tokens = check_int("num_tokens", num_tokens, 5)
        self.embedding_dim = check_int("embedding_dim", embedding_dim, 1)
        self.hidden_size = check_int("hidden_size", hidden_size, 1)
        meta = torch.device("meta")
        # an Embedding made on meta runs its normal_ there (SymPy, see models.uninitialized);
        # given its weight it runs no initialization at all
        self.embedding = torch.nn.Embedding(
            self.num_tokens,
            self.embedding_dim,
            _weight=torch.empty(self.num_tokens, self.embedding_dim),
        )
        self.lstm = torch.nn.LSTM(
            self.embedding_dim, self.hidden_size, batch_first=True, device=meta
        )
        self.projection = torch.nn.Linear(self.hidden_size, self.embedding_dim, device=meta)
        self.output = torch.nn.Linear(self.embedding_dim, self.num_tokens, device=meta)
        materialize(self)  # uninitialized CPU tensors: the same as to_empty(device="cpu")
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Keras' default initialization (see the module docstring), drawn from ``generator``."""
        init = torch.nn.init
        h = self.hidden_size
        with torch.no_grad():
            bound = _EMBEDDING_INIT
            init.uniform_(self.embedding.weight, -bound, bound, generator=generator)
            init.xavier_uniform_(self.lstm.weight_ih_l0, generator=generator)
            init.orthogonal_(self.lstm.weight_hh_l0, generator=generator)
            self.lstm.bias_ih_l0.zero_()
            self.lstm.bias_ih_l0[h : 2 * h] = 1.0  # gates in order (input, forget, cell, output)
            self.lstm.bias_hh_l0.zero_()
            for layer in (self.projection, self.output):
                init.xavier_uniform_(layer.weight, generator=generator)
                layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, T, V + 4)`` of the ids ``x`` ``(n, T)``."""
        hidden, _ = self.lstm(self.embedding(x))
        return self.output(self.projection(hidden))

    def extra_repr(self) -> str:
        """Sizes shown by ``repr``."""
        return (
            f"num_tokens={self.num_tokens}, embedding_dim={self.embedding_dim}, "
            f"hidden_size={self.hidden_size}"
        )


def parameter_count(
    vocab_size: int = 10_000,
    embedding_dim: int = 96,
    hidden_size: int = 670,
    *,
    keras: bool = False,
) -> int:
    """Parameters of :class:`NextWordLSTM` for ``V`` words (``keras=True``: TFF's Keras count).

    ``W e + 4 h (e + h) + 8 h + h e + e + e W + W`` with ``W = V + 4``; Keras' LSTM has one bias
    vector, ``4 h`` fewer parameters. Defaults: 4,053,428 (Keras: 4,050,748).
    """
    w, e, h = vocab_size + 4, embedding_dim, hidden_size
    lstm_biases = 4 * h if keras else 8 * h
    return w * e + 4 * h * (e + h) + lstm_biases + h * e + e + e * w + w


def next_word_counts(logits: torch.Tensor, y: torch.Tensor, *, vocab_size: int) -> dict[str, float]:
    """Summed (not averaged) top-1 hits and target counts of ``logits`` against targets ``y``.

    Parameters
    ----------
    logits : torch.Tensor
        ``(n, T, V + 4)``.
    y : torch.Tensor
        ``int64`` targets ``(n, T)`` with the ids of :func:`special_tokens` ``(vocab_size)``.
    vocab_size : int
        ``V``, the number of vocabulary words.

    Returns
    -------
    dict
        ``"tokens"``/``"correct"`` over non-pad targets, ``"tokens_no_oov"``/``"correct_no_oov"``
        over targets that are neither pad nor oov, ``"tokens_no_oov_eos"``/
        ``"correct_no_oov_eos"`` over targets that are not pad, oov or eos.
    """
    specials = special_tokens(vocab_size)
    hit = logits.argmax(dim=-1) == y
    valid = y != specials.pad
    no_oov = valid & (y != specials.oov)
    no_oov_eos = no_oov & (y != specials.eos)
    return {
        "tokens": float(valid.sum()),
        "correct": float((hit & valid).sum()),
        "tokens_no_oov": float(no_oov.sum()),
        "correct_no_oov": float((hit & no_oov).sum()),
        "tokens_no_oov_eos": float(no_oov_eos.sum()),
        "correct_no_oov_eos": float((hit & no_oov_eos).sum()),
    }
