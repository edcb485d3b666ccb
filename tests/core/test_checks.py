import math

import numpy as np
import pytest

from fedprivopt.core.checks import (
    check_bool,
    check_int,
    check_real,
    interval,
    refuse_repeated_keys,
)


def test_interval_shows_open_and_closed_ends():
    assert interval(0.0, 1.0, True, False) == "(0, 1]"
    assert interval(1.0, math.inf, False, True) == "[1, inf)"


def test_check_real_returns_a_float_inside_the_interval():
    assert check_real("lr", 1, low=0.0, low_open=True) == 1.0
    assert type(check_real("lr", np.float32(0.5), low=0.0, high=1.0)) is float
    assert check_real("beta", 0.0, low=0.0, high=1.0, high_open=True) == 0.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, r"beta must be a real number in \[0, 1\), got True"),
        ("0.5", r"beta must be a real number in \[0, 1\), got '0.5'"),
        (1.0, r"beta must be a finite number in \[0, 1\), got 1.0"),
        (-0.1, r"beta must be a finite number in \[0, 1\), got -0.1"),
        (math.nan, r"beta must be a finite number in \[0, 1\), got nan"),
    ],
)
def test_check_real_names_the_parameter_and_its_range(value, message):
    with pytest.raises(ValueError, match=message):
        check_real("beta", value, low=0.0, high=1.0, high_open=True)


def test_check_real_infinite_bounds_are_open():
    with pytest.raises(ValueError, match=r"x must be a finite number in \(0, inf\), got inf"):
        check_real("x", math.inf, low=0.0, low_open=True)


def test_check_int_converts_numpy_and_refuses_bools_and_floats():
    assert check_int("n", np.int64(3), 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, none=True) is None
    for bad in (True, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"n must be an integer >= 1, got"):
            check_int("n", bad, 1)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1 or None, got 0"):
        check_int("n", 0, 1, none=True)


def test_check_int_upper_bound_and_its_name():
    assert check_int("m", 10, 1, 10) == 10
    with pytest.raises(ValueError, match=r"m must be an integer in \[1, 10\], got 11"):
        check_int("m", 11, 1, 10)
    with pytest.raises(ValueError, match=r"m must be an integer in \[1, population=10\], got 0"):
        check_int("m", 0, 1, 10, high_name="population")
    assert check_int("m", 3, 1, 10, high_name="population") == 3


def test_check_bool_accepts_only_bools():
    assert check_bool("flag", False) is False
    for bad in (0, 1, "true", None):
        with pytest.raises(ValueError, match=r"flag must be true or false, got"):
            check_bool("flag", bad)


def test_refuse_repeated_keys_names_the_key():
    import json

    hook = refuse_repeated_keys(lambda key: f"repeats {key!r}")
    assert json.loads('{"a": 1, "b": 2}', object_pairs_hook=hook) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="repeats 'a'"):
        json.loads('{"a": 1, "a": 2}', object_pairs_hook=hook)
