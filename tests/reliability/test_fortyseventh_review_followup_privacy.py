"""Forty-seventh review of issue 15, follow-up privacy: the first wave's privacy-path fixes.

1. ``reply_updates(message, {1: update}, clip_bits={1: clip_bit(0.2, 1.0)})`` for a
   distributed-noise message (``count-noise-std`` 0.1; the mechanisms reviewer's open row, the
   sending side of mechanisms 2): the exact bit 1.0 was sent as a share, so the node's un-noised
   bit reached the server, which rejects it (``NoisyCountAggregator.check``) but has seen it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, reply_updates
from fedprivopt.models import build_task
from fedprivopt.privacy.adaptive_clip import clip_bit
from tests.messages import delivered

PARAMS = {"num_users": 10, "dim": 5, "num_classes": 3, "seed": 2}


def _message(**local):
    task = build_task("toy", **PARAMS)
    config = LocalConfig(learning_rate=0.1, epochs=1, batch_size=4, clip_norm=1.0, **local)
    settings = P.ClientSettings(local=config, seed=5)
    record = P.encode_train_config(users=[1, 4], round_num=2, settings=settings, stream="train")
    content = {
        P.ARRAYS_RECORD: ArrayRecord(task.build_model().state_dict()),
        P.CONFIG_RECORD: record,
    }
    return delivered(content, "train")


# -- 1: the exact bit sent as a share in a distributed-noise message ------------------------------


@pytest.mark.parametrize(
    "bit", [clip_bit(0.2, 1.0), 0.0, 0.5, -0.5, np.float32(1.0)], ids=["1", "0", "+h", "-h", "np"]
)
def test_1_the_exact_bit_is_not_sent_as_a_share(bit) -> None:
    message = _message(clip_bit=True, count_noise_std=0.1)
    with pytest.raises(ValueError, match=r"clip_bits\[1\] .*not the bit itself") as caught:
        reply_updates(message, {1: torch.zeros(18)}, clip_bits={1: bit})
    assert "got another number" in str(caught.value)
    reply = reply_updates(message, {1: torch.zeros(18)}, clip_bits={1: 0.61})  # a share
    assert float(reply.content[P.update_key(1)][P.CLIP_BIT_ARRAY].numpy()[0]) == 0.61
    server = _message(clip_bit=True)  # server mode: the bit itself is what is sent
    reply = reply_updates(server, {1: torch.zeros(18)}, clip_bits={1: 1.0})
    assert float(reply.content[P.update_key(1)][P.CLIP_BIT_ARRAY].numpy()[0]) == 1.0
    tiny = _message(clip_bit=True, count_noise_std=1e-4)  # below NOISELESS_MIN_STD, as the server
    reply_updates(tiny, {1: torch.zeros(18)}, clip_bits={1: 0.5})
