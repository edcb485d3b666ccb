"""Issue 15, forty-third hostile review (wire: Flower messages, replies, the ClientApp): tests.

1. ``wire.encode_train_config`` (what a ServerApp writes into every train message; public, as
   ``decode_train_config`` is) and the ``wire.ClientSettings`` it encodes, given what is no user
   id, round, stream, seed or flag: users ``[0.5, 1.7]``, ``[True]``, ``["3"]`` or a NumPy float
   array ``[1.0, 2.5]``, ``round_num`` 2.9 or -1, ``stream`` 5 or ``""``, ``seed`` 1.5, ``"7"``
   or -1, ``secure`` ``"false"``, ``report_private_metrics`` ``"no"``. Before: written through
   ``int()``, ``str()`` and ``bool()``: users ``[0, 1]``, ``[1]``, ``[3]`` and ``[1, 2]`` (users
   the caller never named were trained), round 2 (the noise keys of another round), stream
   ``"5"``, seed 1, secure true and private metrics asked for, without a word; -1 and ``""``
   written for the ClientApp to refuse (``decode_train_config`` refuses every one of these since
   the thirty-first review). Now ``ValueError`` naming ``users``, ``round_num``, ``stream``,
   ``seed``, ``secure`` or ``report_private_metrics`` before a message is built
   (``ClientSettings.__post_init__``, ``encode_train_config``), which also refuses a private
   round asking for private metrics (``check_private_metrics``); what fedprivopt's strategies
   write encodes and decodes as before.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig

LOCAL = LocalConfig(learning_rate=0.5, clip_norm=1.0)
SETTINGS = P.ClientSettings(LOCAL, seed=5)


# -- finding 1: encode_train_config writes only what decode_train_config takes ------------------

ENCODED = {
    "users floats": ({"users": [0.5, 1.7]}, "users"),
    "users bool": ({"users": [True]}, "users"),
    "users str": ({"users": ["3"]}, "users"),
    "users numpy floats": ({"users": np.array([1.0, 2.5])}, "users"),
    "users one string": ({"users": "12"}, "users"),
    "round 2.9": ({"round_num": 2.9}, "round_num"),
    "round -1": ({"round_num": -1}, "round_num"),
    "stream 5": ({"stream": 5}, "stream"),
    "stream empty": ({"stream": ""}, "stream"),
}


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_1_encode_train_config_refuses_what_is_no_user_round_or_stream(name):
    changes, parameter = ENCODED[name]
    arguments = {"users": [1, 4], "round_num": 2, "settings": SETTINGS, **changes}
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        P.encode_train_config(**arguments)


SETTINGS_GIVEN = {
    "seed 1.5": ({"seed": 1.5}, "seed"),
    "seed string": ({"seed": "7"}, "seed"),
    "seed -1": ({"seed": -1}, "seed"),
    "seed 2**63": ({"seed": 2**63}, "seed"),
    "secure string": ({"secure": "false"}, "secure"),
    "private metrics string": ({"report_private_metrics": "no"}, "report_private_metrics"),
    "local not a LocalConfig": ({"local": {"learning_rate": 0.5}}, "local"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS_GIVEN))
def test_1_client_settings_refuse_what_is_no_seed_or_flag(name):
    changes, parameter = SETTINGS_GIVEN[name]
    with pytest.raises(ValueError, match=f"^{parameter} must be"):
        P.ClientSettings(**{"local": LOCAL, "seed": 5, **changes})


def test_1_a_private_round_asking_for_private_metrics_is_not_encoded():
    settings = P.ClientSettings(LOCAL, seed=5, report_private_metrics=True)  # clip-norm 1
    with pytest.raises(ValueError, match="'report-private-metrics' is true in a private round"):
        P.encode_train_config(users=[1], round_num=1, settings=settings)


def test_1_what_the_strategies_write_encodes_and_decodes_as_before():
    settings = P.ClientSettings(LOCAL, seed=2**63 - 1, secure=True)
    record = P.encode_train_config(
        users=np.array([4, 1]), round_num=np.int64(3), settings=settings, stream="train-2"
    )
    decoded = P.decode_train_config(record)
    assert decoded.users == (4, 1) and decoded.round_num == 3 and decoded.stream == "train-2"
    assert decoded.settings == settings
    public = P.ClientSettings(LocalConfig(learning_rate=0.5), seed=0, report_private_metrics=True)
    record = P.encode_train_config(users=(u for u in [2]), round_num=0, settings=public)
    assert P.decode_train_config(record).settings.report_private_metrics is True
