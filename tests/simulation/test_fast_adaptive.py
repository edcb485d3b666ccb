"""Adaptive clipping on the fast engine's vectorized cohort path (row-sparse batches)."""

import pytest
import torch

from fedprivopt.simulation.run import simulate
from tests.simulation.test_fast import so_config

ADAPTIVE = {"adaptive-clipping": True, "clip-count-stddev": 1.0, "clip-norm": 0.05}


@pytest.fixture(scope="module")
def so_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("so-fast-adaptive")


def test_vectorized_sequential_and_sharded_give_the_same_clip_norms(tmp_path, so_dir):
    vec = simulate(so_config(so_dir, **ADAPTIVE, **{"cohort-chunk": 2}), tmp_path / "vec")
    seq = simulate(so_config(so_dir, **ADAPTIVE, vectorize=False), tmp_path / "seq")
    ray = simulate(
        so_config(so_dir, **ADAPTIVE, **{"cohort-chunk": 2, "fast-actors": 2}), tmp_path / "ray"
    )
    norms = [r["clip_norm"] for r in vec.rows]
    assert norms[0] == 0.05 and norms[-1] > 0.05  # C grew: the initial C clips everyone
    assert vec.rows[0]["clip_count_fraction"] < 0.5
    for other in (seq, ray):
        assert [r["clip_norm"] for r in other.rows] == pytest.approx(norms, rel=1e-12)
        torch.testing.assert_close(other.params, vec.params, rtol=0, atol=1e-5)
        assert other.epsilon == vec.epsilon
