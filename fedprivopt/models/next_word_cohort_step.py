r"""One local SGD step of a cohort of next-word users: the model's forward and backward, batched.

:func:`sgd_step` is the inner loop of :class:`~fedprivopt.models.next_word_cohort.
NextWordCohortTrainer`: every active user's step on its own weights (stacked ``(a, ...)`` views),
with :class:`~fedprivopt.models.next_word_model.NextWordLSTM`'s layers written as batched
matmuls and the backward pass written out, so no autograd graph is built:

* the LSTM runs over a **packed** minibatch (the examples of each user ordered by length, time
  step ``j`` on the leading ``sizes[j]`` of them), so padding after the sentences costs almost
  nothing;
* the recurrent weight's gradient is one matmul over all time steps (not a sum of per-step
  outer products), and so are the input weights';
* each weight is updated (``w <- w - lr g / P``) as soon as its gradient is known and no longer
  read, so no gradient buffer is kept; the embedding's rows by ``index_put_`` with
  accumulation.

Matmuls of many rows by the per-user weights (strided views of the stack) run as one ``mm`` per
user: ``bmm`` was measured at 21 GFLOP/s for the output layer's, against 47 for the loop, and at
14 against 40 for the projection's backward (one thread). The recurrent matmuls (a few rows
each) and the weight gradients (fresh operands) are ``bmm``'s. The output layer's logits are
``(a, P, W)``, so that the softmax runs along the contiguous dimension: over ``W`` with stride
``P`` (the transposed logits ``(a, W, P)`` of entry 15) it took 8.9 ms against 1.9 ms (P = 300,
one thread), and the layer's forward, softmax and backward 35.6 against 27.1 ms (medians of 8;
``benchmarks/NOTES.md``, entry 16). The recurrent weight's gradient is computed as
``(h_prev^T dgates)^T``: with its update 15.0-15.6 ms against 17.2-18.1 ms (entry 15).
"""

from __future__ import annotations

import torch

from fedprivopt.models.next_word_tokens import PAD

__all__ = ["sgd_step"]


def _batched(device: torch.device) -> bool:
    """Whether every user's products run as one batched call: anywhere but on the CPU."""
    return device.type != "cpu"


def _by_user(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x[i] @ w[i] (+ bias[i])`` for every user ``i``: ``(a, m, n)``.

    On the CPU one ``mm`` per user (each user's weights stay in cache); elsewhere one batched
    product for all users (a GPU would otherwise run ``a`` small kernels, each launched apart).
    """
    if _batched(x.device):
        return torch.bmm(x, w) if bias is None else torch.baddbmm(bias[:, None, :], x, w)
    out = torch.empty(x.shape[0], x.shape[1], w.shape[2], dtype=x.dtype, device=x.device)
    for i in range(x.shape[0]):
        if bias is None:
            torch.mm(x[i], w[i], out=out[i])
        else:
            torch.addmm(bias[i], x[i], w[i], out=out[i])
    return out


def sgd_step(
    p: dict[str, torch.Tensor],
    pc: dict[str, torch.Tensor] | None,
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: list[int],
    lr: float,
) -> None:
    """One local SGD step of every active user, in place on its weights ``p``.

    ``p`` holds ``(a, *shape)`` views of the active users' parameters, ``pc`` the
    preconditioner's ``(1, *shape)`` views (or ``None``); ``x``, ``y`` and ``sizes`` are
    :meth:`~fedprivopt.models.next_word_cohort.NextWordCohortTrainer._step_batch`'s
    packed minibatches; ``lr`` the learning rate. Each weight is updated as soon as its gradient
    is known and no longer read (so no gradient buffer is kept). The forward pass keeps the
    gate activations, the previous states and ``tanh`` of the cells; the backward pass is
    the LSTM's, written out (PyTorch's gate order: input, forget, cell, output).
    """
    a, P = x.shape
    h = p["w_hh"].shape[2]
    dtype, dev = p["emb"].dtype, x.device

    def apply(name: str, grad: torch.Tensor) -> None:  # w <- w - lr grad / P
        if pc is None:
            p[name].sub_(grad, alpha=lr)
        else:
            p[name].addcdiv_(grad, pc[name], value=-lr)

    def apply_product(name: str, left: torch.Tensor, right: torch.Tensor) -> None:
        """``apply(name, left @ right)``; without a preconditioner fused into the weight."""
        if pc is None:  # no gradient buffer: 7.3 ms against 8.1 for w_o's (entry 16)
            p[name].baddbmm_(left, right, alpha=-lr)
        else:
            apply(name, torch.bmm(left, right))

    users = torch.arange(a, device=dev)[:, None]
    # -------- forward
    xe = p["emb"][users, x]  # (a, P, e)
    bias = p["b_ih"] + p["b_hh"]
    acts = _by_user(xe, p["w_ih"].transpose(1, 2), bias)  # gate pre-activations, then values
    w_hh_t = p["w_hh"].transpose(1, 2)
    h_prev = torch.zeros(a, P, h, dtype=dtype, device=dev)  # h_{j-1} of each position
    c_prev = torch.zeros(a, P, h, dtype=dtype, device=dev)
    out_h = torch.empty(a, P, h, dtype=dtype, device=dev)  # h_j
    tcs = torch.empty(a, P, h, dtype=dtype, device=dev)  # tanh(c_j)
    # on the CPU user by user (its recurrent weights stay in cache through time); elsewhere every
    # user at once, a batched product per time step instead of one per user and time step
    groups = [slice(0, a)] if _batched(dev) else [slice(u, u + 1) for u in range(a)]
    for s_u in groups:
        _forward(acts[s_u], w_hh_t[s_u], h_prev[s_u], c_prev[s_u], out_h[s_u], tcs[s_u], sizes)
    proj = _by_user(out_h, p["w_p"].transpose(1, 2), p["b_p"])  # (a, P, e)
    # the logits (a, P, W), so that the softmax runs along the contiguous dimension
    logits = _by_user(proj, p["w_o"].transpose(1, 2), p["b_o"])
    # -------- d (sum over users of each one's mean loss) / d logits: softmax - one-hot
    valid = y != PAD
    count = valid.sum(dim=1, keepdim=True).clamp_min(1).to(dtype)
    weight = valid.to(dtype) / count  # (a, P)
    dlogits = logits.softmax(dim=2)
    del logits
    dlogits.scatter_add_(2, y[:, :, None], -torch.ones_like(weight)[:, :, None])
    dlogits.mul_(weight[:, :, None])
    # -------- output and projection layers
    dproj = _by_user(dlogits, p["w_o"])  # (a, P, e)
    apply_product("w_o", dlogits.transpose(1, 2), proj)
    apply("b_o", dlogits.sum(dim=1))
    del dlogits
    dh_all = _by_user(dproj, p["w_p"])  # (a, P, h): d loss / d h_j from the outputs
    apply_product("w_p", dproj.transpose(1, 2), out_h)
    apply("b_p", dproj.sum(dim=1))
    # -------- LSTM, backwards through time (rows past a step's size stay 0 in dh and dc)
    # the activations' derivatives, in bulk: s (1 - s) of the sigmoid gates, 1 - t^2 of the
    # cell input; and o (1 - tanh(c)^2), the cell's share of d loss / d h
    dacts = torch.addcmul(acts, acts, acts, value=-1.0)
    dacts[..., 2 * h : 3 * h].sub_(acts[..., 2 * h : 3 * h]).add_(1.0)
    kc = torch.mul(tcs, tcs).neg_().add_(1.0).mul_(acts[..., 3 * h :])
    dgates = torch.empty_like(acts)
    for s_u in groups:
        _backward(
            (acts[s_u], dacts[s_u], kc[s_u]),
            p["w_hh"][s_u],
            c_prev[s_u],
            tcs[s_u],
            dh_all[s_u],
            dgates[s_u],
            sizes,
        )
    del dacts, kc
    dxe = _by_user(dgates, p["w_ih"])  # (a, P, e)
    # (h_prev^T dgates)^T: faster than dgates^T h_prev with a transposed left operand
    apply("w_hh", torch.bmm(h_prev.transpose(1, 2), dgates).transpose(1, 2))
    apply_product("w_ih", dgates.transpose(1, 2), xe)
    db = dgates.sum(dim=1)
    apply("b_ih", db)
    apply("b_hh", db)
    # the embedding rows read: each row's update is the sum of its tokens' (P is per row)
    if pc is not None:
        dxe.div_(pc["emb"][0][x])
    p["emb"].index_put_((users.expand(a, P), x), dxe.mul_(-lr), accumulate=True)


def _forward(acts, w_hh_t, h_prev, c_prev, out_h, tcs, sizes: list[int]) -> None:
    """The LSTM's recurrence over the packed time steps (``(a, P, ...)`` tensors, in place).

    ``acts`` holds the gates' input parts on entry and their activations on return; ``h_prev``
    and ``c_prev`` (zeros on entry) get each position's previous state, ``out_h`` its output
    and ``tcs`` ``tanh`` of its cell.
    """
    h = out_h.shape[2]
    c, start = None, 0
    for j, size in enumerate(sizes):
        cur = slice(start, start + size)
        gates = acts[:, cur]
        if j:
            prev = slice(start - sizes[j - 1], start - sizes[j - 1] + size)
            h_prev[:, cur] = out_h[:, prev]
            c_prev[:, cur] = c[:, :size]
            gates.baddbmm_(h_prev[:, cur], w_hh_t)
        gates[..., : 2 * h].sigmoid_()
        gates[..., 2 * h : 3 * h].tanh_()
        gates[..., 3 * h :].sigmoid_()
        i, f, c_in, o = gates.split(h, dim=2)
        c = torch.mul(f, c_prev[:, cur]).addcmul_(i, c_in)
        torch.tanh(c, out=tcs[:, cur])
        torch.mul(o, tcs[:, cur], out=out_h[:, cur])
        start += size


def _backward(forward, w_hh, c_prev, tcs, dh_all, dgates, sizes: list[int]) -> None:
    """Back through the recurrence: the gates' pre-activation gradients into ``dgates``.

    ``forward`` is ``(acts, dacts, kc)``: the gates' activations, their derivatives and
    ``o (1 - tanh(c)^2)``, computed in bulk after the forward pass, so that a time step is a
    handful of in-place operations. ``dh_all`` is the loss's gradient w.r.t. each output; rows
    past a step's size stay 0 in the carried ``dh`` and ``dc`` (the examples still running are a
    leading slice).
    """
    acts, dacts, kc = forward
    a, h = acts.shape[0], tcs.shape[2]
    dh = torch.zeros(a, sizes[0], h, dtype=acts.dtype, device=acts.device)
    dc = torch.zeros_like(dh)
    end = sum(sizes)
    for j in reversed(range(len(sizes))):
        size = sizes[j]
        cur = slice(end - size, end)
        end -= size
        i, f, c_in, _ = acts[:, cur].split(h, dim=2)
        dg = dgates[:, cur]
        dg_i, dg_f, dg_c, dg_o = dg.split(h, dim=2)
        dh_j, dc_j = dh[:, :size], dc[:, :size]
        dh_j += dh_all[:, cur]
        dc_j.addcmul_(dh_j, kc[:, cur])
        # d loss / d (i, f, g, o) times the activations' derivatives
        torch.mul(dc_j, c_in, out=dg_i)
        torch.mul(dc_j, c_prev[:, cur], out=dg_f)
        torch.mul(dc_j, i, out=dg_c)
        torch.mul(dh_j, tcs[:, cur], out=dg_o)
        dg.mul_(dacts[:, cur])
        dc_j.mul_(f)
        if j:
            torch.bmm(dg, w_hh, out=dh_j)
