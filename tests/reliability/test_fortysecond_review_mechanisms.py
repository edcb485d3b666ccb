"""Issue 15, forty-second hostile review (mechanisms: clipping, noise, accounting): tests.

1. The next-word task's vectorized cohort trainer (``NextWordCohortTrainer``, the fast
   engine's default for ``stackoverflow-nwp``) given a float64 ``global_flat`` (the Python API;
   the tag trainer's twin was the forty-first review's observation), ``clip_norm`` 0.05 to 0.9.
   Before: the stack trained in float64, each update was clipped in float64 and cast to
   float32 afterwards, whose rounding left updates above C at each of 8 clip norms
   tried (exact norm up to 1.0000000221 C). Now the update is made float32
   before it is checked and clipped (``NextWordCohortTrainer._finish``): exact norm at most C;
   a float32 ``global_flat`` (what the engines pass) gives the same bits as before.
2. The guarded accountants called directly (public in ``privacy.pld_guard`` and
   ``privacy.prv_guard``): ``pld_epsilon`` and ``prv_epsilon`` of 10 adaptive-clipping events
   (``SubsampledGaussianEvent.poisson(sample_rate=0.1, noise_multiplier=2,
   count_noise_multiplier=1.2)``), of 10 fixed-size events (10 of 100) and of a tree period
   (restart 8). Before: each event was read as a Poisson-subsampled Gaussian of its
   ``noise_multiplier``: ε 0.80 where ``compose_epsilon`` gives 2.69 (the count left out),
   0.81 (prv) and 3.43 (pld) where rdp gives 4.59 for the fixed events, 0.80 where 19.05 for
   the tree. Now both (and ``check_pld_ledger``, ``check_prv_ledger``, ``prv_domain_points``)
   take the ledger through ``pld_guard.poisson_gaussians``: the count folded in as
   ``compose_epsilon`` folds it, fixed and tree events refused with its messages.
3. The tag task's vectorized cohort trainer (``TagCohortTrainer``) given a float16 or bfloat16
   ``global_flat`` (the Python API; the forty-first review's observation said the updates come
   back in that dtype, within C), 40 users, ``clip_norm`` 1e-5 (float16) and 1e-39
   (bfloat16). Before: each user was scaled by ``clip_factor``'s factor in that dtype, whose
   rounding (2**-11 or 2**-8 relative, more near the subnormals) left 3 and 8 of 40 updates
   above C (1.0016 C and 1.12 C), where ``LocalTrainer``'s ``clip_l2`` is exact. Now such a
   dtype's users are clipped by ``clip_l2`` (``TagCohortTrainer._clip``, as the aggregator's
   ``received.PRODUCT_DTYPES``): exact norm at most C; float32 and float64 unchanged.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from fedprivopt.clients import LocalConfig
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.next_word_cohort import NextWordCohortTrainer
from fedprivopt.privacy import RngFactory, SubsampledGaussianEvent, compose_epsilon, prv_guard
from fedprivopt.privacy.pld_guard import check_pld_ledger, pld_epsilon
from tests.tag_synth import make_synth_dir, tag_task


def _exact_sq(vector: torch.Tensor) -> Fraction:
    return sum((Fraction(x) ** 2 for x in vector.double().tolist() if x), Fraction(0))


@pytest.fixture(scope="module")
def nwp_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("r42-mechanisms-nwp")
    return build_task(
        "stackoverflow-nwp", data_dir=str(root), num_users=20, eval_users=2, vocab_size=100,
        embedding_dim=4, hidden_size=4, synth_clients=40, synth_vocab=200, synth_tags=5,
        synth_seed=3,
    )  # fmt: skip


def test_1_next_word_cohort_clips_a_float64_model_in_float32(nwp_task):
    w = initial_flat(nwp_task)
    rngs = RngFactory(seed=11)
    users = list(range(12))
    trainer = NextWordCohortTrainer(nwp_task, device="cpu", chunk_users=12, stacked=True)
    for clip_norm in (0.05, 0.2, 0.9):
        cfg = LocalConfig(
            learning_rate=1.0, epochs=1, batch_size=4, max_examples=8, clip_norm=clip_norm
        )
        limit = Fraction(clip_norm) ** 2
        for model in (w.double(), w):  # float32: what the engines pass, unchanged
            got = [
                pair
                for batch in trainer.train_batches(model, users, round_num=3, config=cfg, rngs=rngs)
                for pair in batch.split()
            ]
            assert [u for u, _ in got] == users
            above = [u for u, d in got if d.dtype != torch.float32 or _exact_sq(d) > limit]
            assert above == [], (clip_norm, model.dtype)


def test_2_guarded_accountants_fold_the_count_and_refuse_other_relations(monkeypatch):
    count = SubsampledGaussianEvent.poisson(
        sample_rate=0.1, noise_multiplier=2.0, count_noise_multiplier=1.2
    )
    ledger = [(count, 10)]
    want = compose_epsilon(ledger, 1e-5, accountant="pld", pld_discretization=1e-2)
    assert want > 2.5
    assert pld_epsilon(ledger, 1e-5, 1e-2) == want
    # prv: the ledger Opacus is handed is the one Gaussian (without importing Opacus here)
    handed = []

    def stop(ledger, delta, eps_error):
        handed.append(ledger)
        raise RuntimeError("stop")

    monkeypatch.setattr(prv_guard, "check_prv_ledger", stop)
    with pytest.raises(RuntimeError, match="stop"):
        prv_guard.prv_epsilon(ledger, 1e-5, 0.01)
    assert handed == [((count.single_gaussian(), 10),)]
    monkeypatch.undo()
    fixed = SubsampledGaussianEvent.fixed(population=100, cohort_size=10, noise_multiplier=2.0)
    tree = SubsampledGaussianEvent.tree(
        population=100, cohort_size=10, noise_multiplier=2.0, restart_rounds=8
    )
    for event, words in ((fixed, "supports only Poisson"), (tree, "tree aggregation")):
        for call in (
            lambda e: pld_epsilon([(e, 10)], 1e-5, 1e-2),
            lambda e: prv_guard.prv_epsilon([(e, 10)], 1e-5, 0.01),
            lambda e: check_pld_ledger([(e, 10)], 1e-2),
            lambda e: prv_guard.check_prv_ledger([(e, 10)], 1e-5, 0.01),
        ):
            with pytest.raises(ValueError, match=words):
                call(event)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return make_synth_dir(tmp_path_factory, "r42-mechanisms-tag")


@pytest.mark.parametrize(
    ("dtype", "clip_norm"), [(torch.float16, 1e-5), (torch.bfloat16, 1e-39)], ids=str
)
def test_3_vectorized_tag_clip_in_half_precision(synth_dir, dtype, clip_norm):
    task = tag_task(synth_dir)
    w = initial_flat(task).to(dtype)
    cfg = LocalConfig(learning_rate=0.5, epochs=1, batch_size=8, clip_norm=clip_norm)
    trainer = task.cohort_trainer(device="cpu")
    got = [
        pair
        for batch in trainer.train_batches(
            w, list(range(40)), round_num=1, config=cfg, rngs=RngFactory(seed=0)
        )
        for pair in batch.split()
    ]
    assert len(got) == 40
    limit = Fraction(clip_norm) ** 2
    above = [u for u, update in got if _exact_sq(update.values.flatten()) > limit]
    assert above == []
    assert all(update.values.dtype == dtype for _, update in got)
