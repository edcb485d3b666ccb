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

Matmuls by a transposed batch of per-user weights run as one ``addmm`` per user: ``bmm`` was
measured at 21 GFLOP/s for the output layer's, against 47 for the loop (one thread).
"""

from __future__ import annotations

import torch

from fedprivopt.models.next_word_tokens import PAD

__all__ = ["sgd_step"]


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
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)

    def apply(name: str, grad: torch.Tensor) -> None:  # w <- w - lr grad / P
        if pc is None:
            p[name].sub_(grad, alpha=lr)
        else:
            p[name].addcdiv_(grad, pc[name], value=-lr)

    users = torch.arange(a, device=dev)[:, None]
    # -------- forward
    xe = p["emb"][users, x]  # (a, P, e)
    bias = p["b_ih"] + p["b_hh"]
    acts = torch.empty(a, P, 4 * h, dtype=dtype, device=dev)  # gate activations
    for i in range(a):  # (a matmul by a transposed batch of weights is slow in bmm)
        torch.addmm(bias[i], xe[i], p["w_ih"][i].t(), out=acts[i])
    w_hh_t = p["w_hh"].transpose(1, 2)
    h_prev = torch.zeros(a, P, h, dtype=dtype, device=dev)  # h_{j-1} of each position
    c_prev = torch.zeros(a, P, h, dtype=dtype, device=dev)
    out_h = torch.empty(a, P, h, dtype=dtype, device=dev)  # h_j
    tcs = torch.empty(a, P, h, dtype=dtype, device=dev)  # tanh(c_j)
    c = None
    for j, size in enumerate(sizes):
        cur = slice(starts[j], starts[j + 1])
        gates = acts[:, cur]
        if j:
            prev = slice(starts[j - 1], starts[j - 1] + size)
            h_prev[:, cur] = out_h[:, prev]
            c_prev[:, cur] = c[:, :size]
            gates.baddbmm_(h_prev[:, cur], w_hh_t)
        gates[..., : 2 * h].sigmoid_()
        gates[..., 2 * h : 3 * h].tanh_()
        gates[..., 3 * h :].sigmoid_()
        i, f, c_in, o = gates.split(h, dim=2)
        c = torch.addcmul(f * c_prev[:, cur], i, c_in)
        tc = torch.tanh(c)
        tcs[:, cur] = tc
        out_h[:, cur] = o * tc
    proj = torch.baddbmm(p["b_p"][:, None, :], out_h, p["w_p"].transpose(1, 2))  # (a, P, e)
    logits = torch.empty(a, P, p["w_o"].shape[1], dtype=dtype, device=dev)
    for i in range(a):
        torch.addmm(p["b_o"][i], proj[i], p["w_o"][i].t(), out=logits[i])
    # -------- d (sum over users of each one's mean loss) / d logits: softmax - one-hot
    valid = y != PAD
    count = valid.sum(dim=1, keepdim=True).clamp_min(1).to(dtype)
    weight = valid.to(dtype) / count  # (a, P)
    dlogits = logits.softmax(dim=2)
    del logits
    dlogits.scatter_add_(2, y[..., None], -torch.ones_like(weight)[..., None])
    dlogits.mul_(weight[..., None])
    # -------- output and projection layers
    dproj = torch.bmm(dlogits, p["w_o"])  # (a, P, e)
    apply("w_o", torch.bmm(dlogits.transpose(1, 2), proj))
    apply("b_o", dlogits.sum(dim=1))
    del dlogits
    dh_all = torch.bmm(dproj, p["w_p"])  # (a, P, h): d loss / d h_j from the outputs
    apply("w_p", torch.bmm(dproj.transpose(1, 2), out_h))
    apply("b_p", dproj.sum(dim=1))
    # -------- LSTM, backwards through time (rows past a step's size stay 0 in dh and dc)
    dgates = torch.empty_like(acts)
    dh = torch.zeros(a, sizes[0], h, dtype=dtype, device=dev)
    dc = torch.zeros_like(dh)
    w_hh = p["w_hh"]
    for j in reversed(range(len(sizes))):
        size, cur = sizes[j], slice(starts[j], starts[j + 1])
        i, f, c_in, o = acts[:, cur].split(h, dim=2)
        tc = tcs[:, cur]
        dh_j, dc_j = dh[:, :size], dc[:, :size]
        dh_j += dh_all[:, cur]
        dc_j.addcmul_(dh_j * o, 1.0 - tc * tc)
        # through the activations: sigmoid' = s (1 - s), tanh' = 1 - t^2
        dgates[:, cur] = torch.cat(
            [
                dc_j * c_in * i * (1.0 - i),
                dc_j * c_prev[:, cur] * f * (1.0 - f),
                dc_j * i * (1.0 - c_in * c_in),
                dh_j * tc * o * (1.0 - o),
            ],
            dim=2,
        )
        dc_j.mul_(f)
        if j:
            torch.bmm(dgates[:, cur], w_hh, out=dh_j)
    dxe = torch.bmm(dgates, p["w_ih"])  # (a, P, e)
    dgates_t = dgates.transpose(1, 2)
    apply("w_hh", torch.bmm(dgates_t, h_prev))
    apply("w_ih", torch.bmm(dgates_t, xe))
    db = dgates.sum(dim=1)
    apply("b_ih", db)
    apply("b_hh", db)
    # the embedding rows read: each row's update is the sum of its tokens' (P is per row)
    if pc is not None:
        dxe.div_(pc["emb"][0][x])
    p["emb"].index_put_((users.expand(a, P), x), dxe.mul_(-lr), accumulate=True)
