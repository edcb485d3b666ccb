"""Issue 15, forty-second hostile review (contract: the privacy contract, end to end): tests.

1. ``summary.json``'s ``threat_model`` of a seeded run (``secure = false``, the default;
   ``simulate toy.toml``, also with ``noise-mode = distributed``). Before: "user-level DP of
   every released model ...; the server is trusted with individual clipped updates" (in
   distributed mode "each update leaves its device carrying a noise share"), while the same
   file records ``seed`` 0, from which all noise, the sampling and every client's share are
   regenerated; the server derives and sends the clients' seed, so in distributed mode it can
   remove the shares (docs/DEPLOYMENT.md, "Seeds are secrets"; DESIGN.md rule 8). Now the
   threat model of a seeded run says the guarantee holds only while the seed is secret, and in
   distributed mode that the shares protect nothing from the server unless ``secure = true``
   (``writer._threat_model``); a secure run's says neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def _summary(tmp_path: Path, name: str, **overrides: object) -> dict:
    config = load_config(TOY, {"num-server-rounds": 1, **overrides})
    simulate(config, tmp_path / name)
    return json.loads((tmp_path / name / "summary.json").read_text())


@pytest.mark.parametrize("mode", ["server", "distributed"])
def test_1_seeded_threat_model_names_the_seed(tmp_path: Path, mode: str) -> None:
    seeded = _summary(tmp_path, "seeded", **{"noise-mode": mode, "seed": 7})
    text = seeded["threat_model"]
    assert "seeded (secure = false)" in text and "seed 7" in text
    assert "only while the seed is secret" in text
    assert ("shares protect nothing from the server" in text) == (mode == "distributed")
    secure = _summary(tmp_path, "secure", **{"noise-mode": mode, "secure": True})
    assert "seed" not in secure["threat_model"]
    assert secure["threat_model"].startswith("user-level DP of every released model")
