"""Forty-second review of issue 15: the lead's findings (rows the reviewers left open).

2. ``LocalTrainer(task).load_global(v)`` (the public method that loads a global model for
   evaluation) with ``v`` of the layout's length and dtype but on the meta device or sparse.
   Before: torch's ``NotImplementedError`` ("Cannot copy out of meta tensor; no data!", "Could
   not run 'aten::as_strided' ... 'SparseCPU'"), where ``train`` refuses the same with a
   ``ValueError`` since the api reviewer's fix 7. Now: ``ValueError`` naming ``global_flat``
   (``ModelLayout.load_global``).
"""

from __future__ import annotations

import pytest
import torch

from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models import build_task


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_2_load_global_of_a_tensor_without_values_names_the_argument(kind):
    trainer = LocalTrainer(build_task("toy", num_users=4, seed=0))
    n = trainer.spec.numel
    flat = torch.zeros(n, device="meta") if kind == "meta" else torch.zeros(n).to_sparse()
    with pytest.raises(ValueError, match="global_flat must be a dense tensor with values"):
        trainer.load_global(flat)
    model = trainer.load_global(torch.zeros(n))  # a dense one still loads
    assert all(float(p.detach().abs().sum()) == 0.0 for p in model.parameters())
