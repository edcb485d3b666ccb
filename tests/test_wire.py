import pytest

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig


def test_train_config_round_trip():
    local = LocalConfig(
        learning_rate=0.25, epochs=2, batch_size=8, max_examples=16, clip_norm=0.5, noise_std=0.01
    )
    # a private round never asks for private metrics (forty-second review of issue 15, wire 2)
    settings = P.ClientSettings(local=local, seed=9, report_private_metrics=False)
    record = P.encode_train_config(users=[3, 1], round_num=4, settings=settings, stream="cohort-2")
    assert set(record) == {
        P.USERS,
        P.ROUND,
        P.STREAM,
        P.LOCAL_LEARNING_RATE,
        P.LOCAL_EPOCHS,
        P.BATCH_SIZE,
        P.MAX_EXAMPLES,
        P.CLIP_NORM,
        P.NOISE_STD,
        P.SEED,
        P.SECURE,
        P.REPORT_PRIVATE_METRICS,
    }
    req = P.decode_train_config(record)
    assert req == P.TrainConfig(users=(3, 1), round_num=4, stream="cohort-2", settings=settings)
    assert not req.settings.secure


def test_zero_means_none_and_private_metrics_default_off():
    local = LocalConfig(learning_rate=0.1)
    record = P.encode_train_config(
        users=[0], round_num=1, settings=P.ClientSettings(local=local, seed=0)
    )
    assert record[P.MAX_EXAMPLES] == 0 and record[P.CLIP_NORM] == 0.0
    del record[P.REPORT_PRIVATE_METRICS]
    req = P.decode_train_config(record)
    assert req.settings.local == local and not req.settings.report_private_metrics


def test_decode_rejects_bad_configs():
    good = dict(
        P.encode_train_config(
            users=[0, 1],
            round_num=1,
            settings=P.ClientSettings(local=LocalConfig(learning_rate=0.1), seed=0),
        )
    )
    with pytest.raises(ValueError, match="settings"):
        P.encode_train_config(users=[0], round_num=1, settings={"seed": 0})
    for key in (P.USERS, P.CLIP_NORM, P.SEED):
        bad = {k: v for k, v in good.items() if k != key}
        with pytest.raises(ValueError, match=key):
            P.decode_train_config(bad)
    with pytest.raises(ValueError, match="repeats"):
        P.decode_train_config({**good, P.USERS: [1, 1]})
    # the key named (forty-fifth review of issue 15, wire 2: LocalConfig's "learning_rate")
    with pytest.raises(ValueError, match=f"train config '{P.LOCAL_LEARNING_RATE}'"):
        P.decode_train_config({**good, P.LOCAL_LEARNING_RATE: -1.0})
    with pytest.raises(ValueError, match=P.CLIP_NORM):
        P.decode_train_config({**good, P.CLIP_NORM: -1.0})


def test_update_keys():
    assert P.update_key(17) == "update/17"
    assert P.parse_update_key("update/17") == 17
    assert P.parse_update_key("train-metrics") is None
    assert P.parse_update_key("update/x") is None


def test_hosted_users_partition_the_users():
    parts = [P.hosted_users(p, 3, 10) for p in range(3)]
    assert parts[0] == [0, 3, 6, 9]
    assert sorted(u for part in parts for u in part) == list(range(10))
    assert P.hosted_users(4, 5, 3) == []
    with pytest.raises(ValueError, match=P.NODE_PARTITION_ID):
        P.hosted_users(3, 3, 10)
    with pytest.raises(ValueError, match=P.NODE_NUM_PARTITIONS):
        P.hosted_users(0, 0, 10)


def test_adaptive_clipping_settings_round_trip_and_default_off():
    local = LocalConfig(learning_rate=0.1, clip_norm=0.5, clip_bit=True, count_noise_std=0.25)
    settings = P.ClientSettings(local=local, seed=3)
    record = P.encode_train_config(users=[0], round_num=1, settings=settings)
    assert record[P.CLIP_BIT] is True and record[P.COUNT_NOISE_STD] == 0.25
    assert P.decode_train_config(record).settings == settings
    plain = P.encode_train_config(
        users=[0],
        round_num=1,
        settings=P.ClientSettings(local=LocalConfig(learning_rate=0.1), seed=0),
    )
    assert P.CLIP_BIT not in plain and P.COUNT_NOISE_STD not in plain
    assert not P.decode_train_config(plain).settings.local.clip_bit
