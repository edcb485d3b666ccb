"""Issue 15, forty-third hostile review (mechanisms: clipping, noise and epsilon): tests.

1. ``clip_l2(v, 1.0)`` (the public clipping function, what a ClientApp of one's own may call)
   of a ``torch.Tensor`` subclass whose own ``is_nested`` reads True and whose
   ``__torch_function__`` reports every norm as 0.001, 100 entries of 100. Before: returned
   unclipped: ``norm`` 0.001, ``clipped`` False, the vector of norm 1000 where C = 1 (the
   forty-second review's lead 8 refused subclasses, but let any tensor that said it was nested
   through, for torch's nested tensors); a nested tensor of torch's own raised torch's
   ``RuntimeError`` (``reshape: For now nested reshape cannot ...``) from ``clip_l2`` and
   ``l2_norm``. Now every subclass but ``Parameter`` is refused (``ValueError: vector must be a
   plain torch.Tensor ...``), and a nested tensor, read through torch's own ``is_nested``, is a
   ``ValueError`` (``vector must be a dense (strided) tensor, got a nested tensor``).
2. ``clip_l2(u, 1.0)`` of a plain tensor of norm 0.01 whose instance carries its own ``detach``
   (returning 100 entries of 100), the result handed to ``clients.reply_updates``, which reads
   an update by its ``detach()``. Before: the vector was measured through ``torch.Tensor.detach``
   (the forty-second review's lead 8) but, being within C, returned as the instance itself:
   ``result.vector.detach()`` had norm 1000 where C = 1, and that is what a reply would carry.
   Now an unclipped vector whose instance has attributes of its own comes back as the detached
   alias that was measured (no attributes; entries unchanged); any other as itself.
3. ``add_gaussian_noise(v, 10.0, generator=g)`` (the public noise function, what a ClientApp of
   one's own may call after ``clip_l2``) of a ``torch.Tensor`` subclass whose own
   ``__torch_function__`` returns the first argument of an addition. Before: returned the
   vector without noise (``[0.3] * 5`` exactly, std 10 asked), as a ``_DropsTheNoise``. Now
   refused (``ValueError: vector must be a plain torch.Tensor, got a _DropsTheNoise ...``), as
   ``clip_l2`` and ``privatize_update`` refuse subclasses; a ``Parameter`` gets its noise.
4. ``v * clip_factor(l2_norm(v), 1.0, torch.float32, numel=100)`` (the recipe ``clip_factor``'s
   docstring gives) of a plain tensor of 100 entries of 100 whose instance carries its own
   ``detach`` (returning entries of 1e-4), or of a subclass that reads norms as 0.001. Before:
   ``l2_norm`` read the vector through the instance's ``detach`` (or the subclass's own
   operations): 0.001, so the factor was 1 and ``v`` kept its norm 1000 where C = 1. Now
   ``l2_norm`` (and ``vector_norm_checked``) read the entries through ``torch.Tensor.detach``
   and refuse a subclass other than ``Parameter``, as ``clip_l2`` does: 1000.0, scaled within C.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fedprivopt.privacy.clip import clip_factor, clip_l2, l2_norm
from fedprivopt.privacy.noise import add_gaussian_noise


class _NestedLiar(torch.Tensor):
    """Says it is nested, and reads every norm as 0.001."""

    @property
    def is_nested(self):
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if getattr(func, "__name__", "") in ("vector_norm", "norm"):
            return out * 0 + 1e-3
        return out


def test_1_clip_l2_refuses_a_subclass_that_says_it_is_nested():
    v = torch.full((100,), 100.0).as_subclass(_NestedLiar)
    with pytest.raises(ValueError, match=r"plain torch\.Tensor, got a _NestedLiar"):
        clip_l2(v, 1.0)


def test_1_a_nested_tensor_is_one_value_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning of nested tensors
        nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(2)])
    for call in (lambda: clip_l2(nested, 1.0), lambda: l2_norm(nested)):
        with pytest.raises(ValueError, match="got a nested tensor"):
            call()
    # plain tensors and Parameters clip as before
    assert float(torch.linalg.vector_norm(clip_l2(torch.full((4,), 3.0), 1.0).vector)) <= 1.0
    p = torch.nn.Parameter(torch.full((4,), 3.0))
    assert clip_l2(p, 1.0).clipped


def test_2_an_unclipped_vector_comes_back_without_its_own_detach():
    u = torch.full((100,), 0.001)
    u.detach = lambda: torch.full((100,), 100.0)  # what reply_updates reads
    result = clip_l2(u, 1.0)
    assert not result.clipped
    assert result.vector is not u and not vars(result.vector)
    assert float(torch.linalg.vector_norm(result.vector.detach())) <= 1.0
    assert torch.equal(torch.Tensor.detach(result.vector), torch.full((100,), 0.001))
    # a tensor of no attributes of its own is still returned as itself (autograd kept)
    v = torch.full((4,), 0.1, requires_grad=True)
    assert clip_l2(v, 1.0).vector is v


class _DropsTheNoise(torch.Tensor):
    """Its own add returns its first argument."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("add", "__add__"):
            return args[0]
        return super().__torch_function__(func, types, args, kwargs or {})


def test_3_add_gaussian_noise_refuses_a_subclass():
    v = torch.full((5,), 0.3).as_subclass(_DropsTheNoise)
    with pytest.raises(ValueError, match=r"plain torch\.Tensor, got a _DropsTheNoise"):
        add_gaussian_noise(v, 10.0, generator=torch.Generator().manual_seed(0))
    # plain tensors and Parameters get their noise as before
    p = torch.nn.Parameter(torch.zeros(5))
    out = add_gaussian_noise(p, 1.0, generator=torch.Generator().manual_seed(0))
    assert out.shape == (5,) and bool(out.ne(0).all())


def test_4_l2_norm_reads_the_entries_themselves():
    u = torch.full((100,), 100.0)
    u.detach = lambda: torch.full((100,), 1e-4)  # a lying instance method
    assert l2_norm(u) == pytest.approx(1000.0)
    scaled = u * clip_factor(l2_norm(u), 1.0, torch.float32, numel=100)
    assert float(torch.linalg.vector_norm(torch.Tensor.detach(scaled))) <= 1.0
    with pytest.raises(ValueError, match=r"plain torch\.Tensor, got a _NestedLiar"):
        l2_norm(torch.full((100,), 100.0).as_subclass(_NestedLiar))
    assert l2_norm(torch.nn.Parameter(torch.full((4,), 3.0))) == pytest.approx(6.0)
