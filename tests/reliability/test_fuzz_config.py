"""Fuzz tests of the run configuration: presets (TOML) and ``--set key=value`` overrides.

Documents are built from the toy preset's real keys, then mutated: wrong types, out-of-range and
huge values, unknown keys, keys nested where they do not belong, unknown ``[strategies.<name>]``
tables. Properties:

* :func:`load_config` returns a :class:`RunConfig` or raises ``ValueError`` whose message names a
  mutated key; no other exception type escapes (``TypeError``, ``OverflowError``, tomllib's
  errors, ...);
* an accepted document is never silently changed: every key in effect (after the precedence
  preset < ``[strategies.<strategy>]`` < overrides) appears in the config with its value, every
  ``[strategies.<name>]`` table names a real strategy and holds only real keys, and ``device``
  has the documented form;
* :func:`parse_override` either rejects the text or returns exactly the TOML value written after
  ``=`` (or the text itself when it is not TOML);
* valid configurations round-trip through ``config_to_toml`` and ``load_config`` unchanged.

Not covered: values inside the tables of strategies that do not run are checked for their names
only (their values are validated when that strategy runs, e.g. by ``fedprivopt compare``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fedprivopt.privacy.adaptive_clip import update_noise_multiplier
from fedprivopt.simulation.config import (
    RunConfig,
    config_to_toml,
    load_config,
    resolve_config,
)
from fedprivopt.simulation.config_presets import parse_override
from fedprivopt.strategies.config import (
    MAX_SUM_NOISE_STD,
    NON_PRIVATE,
    STRATEGIES,
    StrategyConfig,
)
from fedprivopt.strategies.options import BLOCKS, Rule, rules_of
from tests.reliability.conftest import count, fuzz_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESET = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"
BASE = tomllib.loads(PRESET.read_text())
STRATEGY_KEYS = sorted(StrategyConfig.keys())
RUN_KEYS = sorted(
    f.name.replace("_", "-")
    for f in dataclasses.fields(RunConfig)
    if f.name not in ("strategy", "task_params")
)
KNOWN = set(STRATEGY_KEYS) | set(RUN_KEYS)
FUZZ = fuzz_settings(150)
DEVICE = re.compile(r"(auto|cpu|cuda(:[0-9]+)?)\Z")

# -- a small TOML writer (quoted keys, basic strings) ----------------------------------------------


def _string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")  # DEL must be escaped in TOML, JSON leaves it


def toml_value(value) -> str:
    """TOML text of a scalar, date/time or array (tables are written by :func:`toml_document`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(type(value))


def toml_document(data: dict, prefix: tuple[str, ...] = ()) -> str:
    """TOML text of a nested dict: scalars first, then one ``[a.b]`` section per sub-table."""
    lines = [f"{_string(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            path = (*prefix, k)
            lines.append("\n[" + ".".join(_string(p) for p in path) + "]")
            lines.append(toml_document(v, path))
    return "\n".join(lines)


# -- generators -----------------------------------------------------------------------------------

bad_values = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63, -(2**63) - 1, 2**1100, -(10**400)]),
    st.integers(min_value=-3, max_value=3),
    st.floats(),
    st.floats(min_value=-2.0, max_value=2.0),
    st.text(max_size=12),
    st.sampled_from(["auto", "cpu", "cuda", "cuda:1", "cudax", "cuda:", "cuda:one", "gpu"]),
    st.sampled_from([*STRATEGIES, "poisson", "fixed", "server", "distributed", "rdp", "pld"]),
    st.booleans(),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=3)), max_size=3),
    st.dates(),
    st.times(),
    st.dictionaries(
        st.sampled_from(["a", "clip-norm", "seed"]), st.integers(-3, 3), min_size=1, max_size=2
    ),
)
key_names = st.one_of(
    st.sampled_from(sorted(KNOWN)),
    st.sampled_from(["task-params", "strategies"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.0123456789 ", min_size=1, max_size=12),
)
mutations = st.lists(
    st.tuples(
        st.sampled_from(["top", "selected", "other", "unknown-table", "task-params"]),
        key_names,
        bad_values,
    ),
    min_size=1,
    max_size=3,
)


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _mutate(doc: dict, strategy: str, where: str, key: str, value, rng_name: str):
    """Apply one mutation; returns the names an error message may use for it."""
    key = key.strip() or "k"
    if where == "top":
        doc[key] = value
        names = {key}
    elif where == "task-params":
        if not isinstance(doc.get("task-params"), dict):
            doc["task-params"] = {}
        doc["task-params"][key] = value
        names = {key}
    else:
        table = {"selected": strategy, "other": rng_name, "unknown-table": "dp-fedavgg"}[where]
        if not isinstance(doc.get("strategies"), dict):
            doc["strategies"] = {}
        if not isinstance(doc["strategies"].get(table), dict):
            doc["strategies"][table] = {}
        doc["strategies"][table][key] = value
        names = {key, f"strategies.{table}"}
    cross = set()
    if names & {"population", "clients-per-round", "sampling"}:
        cross.add("clients-per-round")
    if names & {"strategy", "noise-multiplier"}:
        cross.add("noise-multiplier")
    return names | cross | {n.split(".")[0] for n in names}


def _numbers_equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and (isinstance(a, bool) == isinstance(b, bool))


def check_accepted(config: RunConfig, doc: dict, overrides: dict) -> None:
    """An accepted document: every key in effect is in ``config`` with its value."""
    flat = _flatten(doc)
    flat.update(_flatten(overrides))
    strategy = flat.get("strategy", "dp-fedavg")
    assert strategy in STRATEGIES
    for key, _ in flat.items():
        if key.startswith("strategies."):
            name, _, rest = key[len("strategies.") :].partition(".")
            assert name in STRATEGIES, f"accepted a table for unknown strategy {name!r}"
            assert rest in KNOWN or rest.startswith("task-params."), f"accepted key {key!r}"
            assert rest != "strategy", f"accepted {key!r}: the table would pick another strategy"
    effective = {k: v for k, v in flat.items() if not k.startswith("strategies.")}
    effective.update(
        {
            k[len(f"strategies.{strategy}.") :]: v
            for k, v in flat.items()
            if k.startswith(f"strategies.{strategy}.")
        }
    )
    effective.update(_flatten(overrides))
    mapping = config.to_mapping()
    task_params = {}
    for key, value in effective.items():
        if key.startswith("task-params."):
            task_params[key.split(".", 1)[1].replace("-", "_")] = value
            continue
        if key in config.strategy.unused:  # another strategy's option: set aside, not applied
            assert key not in mapping
            continue
        assert key in mapping, f"key {key!r} was accepted but is not in the config"
        assert _numbers_equal(mapping[key], value), (key, mapping[key], value)
    assert config.task_params == task_params
    assert DEVICE.match(config.device), f"accepted device {config.device!r}"


def load_and_check(path: Path, doc: dict, overrides: dict, names: set[str]) -> RunConfig | None:
    path.write_text(toml_document(doc))
    try:
        config = load_config(path, overrides)
    except ValueError as exc:
        message = str(exc)
        assert any(n in message for n in names), f"{message!r} names none of {sorted(names)}"
        return None
    check_accepted(config, doc, overrides)
    return config


# -- properties -----------------------------------------------------------------------------------


@FUZZ
@given(
    strategy=st.sampled_from(STRATEGIES),
    muts=mutations,
    other=st.sampled_from(STRATEGIES),
)
@example(strategy="dp-fedavg", muts=[("top", "noise-multiplier", 2**1100)], other="dp2")
@example(strategy="dp-fedavg", muts=[("top", "client-cpus", 2**1100)], other="dp2")
@example(strategy="dp-fedavg", muts=[("top", "seed", 2**64)], other="dp2")
@example(strategy="dp-fedavg", muts=[("top", "device", "cuda:one")], other="dp2")
@example(strategy="dp-fedavg", muts=[("unknown-table", "clip-norm", 0.5)], other="dp2")
@example(strategy="dp-fedavg", muts=[("other", "clip-nrom", 0.5)], other="dp2")
@example(strategy="dp-fedavg", muts=[("selected", "strategy", "dp-fedadam")], other="dp2")
def test_presets_give_a_config_or_an_error_naming_the_key(tmp_path, strategy, muts, other):
    count("config")
    doc = json.loads(json.dumps(BASE))
    doc["strategy"] = strategy
    names: set[str] = set()
    for where, key, value in muts:
        names |= _mutate(doc, strategy, where, key, value, other)
    load_and_check(tmp_path / "preset.toml", doc, {}, names)


@FUZZ
@given(
    key=st.one_of(st.sampled_from(sorted(KNOWN)), key_names).filter(lambda k: "=" not in k),
    raw=st.one_of(
        st.text(max_size=16),
        bad_values.filter(lambda v: not isinstance(v, dict)).map(toml_value),
        st.sampled_from(["1\n[x]\ny = 2", "0.5 # comment", "1\nz = 3", '"a"\n"b" = 1']),
    ),
)
@example(key="seed", raw="1\n[x]\ny = 2")
@example(key="client-cpus", raw="false")  # was accepted as 0.0 (bool is an int)
def test_set_overrides_give_the_written_value_or_a_clear_error(tmp_path, key, raw):
    count("config")
    text = f"{key}={raw}"
    try:
        name, value = parse_override(text)
    except ValueError as exc:
        assert "--set" in str(exc)
        return
    assert name == key.strip() and name
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        parsed = None
    if parsed is not None and set(parsed) == {"v"}:
        assert _numbers_equal(value, parsed["v"]) or value == parsed["v"]
    else:  # not one TOML value: kept as text
        assert value == raw.strip()
    names = {name, name.split(".")[0]}
    if name in ("population", "clients-per-round", "sampling"):
        names.add("clients-per-round")
    if name in ("strategy", "noise-multiplier"):
        names.add("noise-multiplier")
    doc = json.loads(json.dumps(BASE))
    load_and_check(tmp_path / "preset.toml", doc, {name: value}, names)


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_arbitrary_files_are_rejected_with_the_file_named(tmp_path, content):
    count("config")
    path = tmp_path / "junk.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    try:
        config = load_config(path)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(config, RunConfig)


# -- round trip -----------------------------------------------------------------------------------

_BMP_TEXT = st.text(
    alphabet=st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)


#: the keys only adaptive clipping reads, at their defaults (F3 of the eleventh review)
ADAPTIVE_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(StrategyConfig)
    if f.name in ("clip_quantile", "clip_learning_rate", "clip_count_stddev")
}
#: every rule of the shared settings and of every strategy's option block
RULES = {
    name: rule for cls in (StrategyConfig, *BLOCKS.values()) for name, rule in rules_of(cls).items()
}


def _valid(rule: Rule):
    if rule.kind == "choice":
        return st.sampled_from(rule.choices)
    if rule.kind == "bool":
        return st.booleans()
    if rule.kind == "int":
        high = 2**63 - 1 if math.isinf(rule.high) else int(rule.high)
        return st.integers(min_value=int(rule.low), max_value=high)
    return st.floats(
        min_value=rule.low,
        max_value=min(rule.high, 1e300),
        exclude_min=rule.low_open,
        exclude_max=rule.high_open and rule.high < 1e300,
        allow_nan=False,
        allow_infinity=False,
    )


def _finite_variance(data: dict) -> bool:
    try:
        return math.isfinite(
            (data["noise_multiplier"] * data["clip_norm"] / data["clients_per_round"]) ** 2
        )
    except OverflowError:
        return False


def _noise_std_ok(data: dict) -> bool:
    """σ_Δ C max(1, 1/m̄) at most ``MAX_SUM_NOISE_STD`` for each clip norm (eleventh review)."""
    if data["strategy"] in NON_PRIVATE or data["noise_multiplier"] == 0:
        return True
    sigma, m = data["noise_multiplier"], data["clients_per_round"]
    if data["adaptive_clipping"]:
        sigma = update_noise_multiplier(sigma, data["clip_count_stddev"] or m / 20)
    scale = sigma * max(1.0, 1.0 / m)
    norms = (data["clip_norm"], data.get("clip_norm_adaptive"))
    return all(c is None or c <= MAX_SUM_NOISE_STD / scale for c in norms)


@st.composite
def valid_mappings(draw) -> dict:
    data: dict = {}
    for name, rule in RULES.items():
        data[name] = draw(_valid(rule))
    population = data["population"] = draw(st.integers(1, 10**6))
    if data["sampling"] == "fixed":
        data["clients_per_round"] = float(draw(st.integers(1, population)))
    else:
        data["clients_per_round"] = draw(
            st.floats(min_value=0, max_value=population, exclude_min=True)
        )
    if data["strategy"] not in ("fedavg", "fedadam") and data["noise_multiplier"] == 0:
        data["noise_multiplier"] = 1.0
    if 0 < data["noise_multiplier"] < 1e-100:  # below it the accountants are not reliable
        data["noise_multiplier"] = 1e-100
    if not _finite_variance(data):  # the noise variance of the mean must be a float
        data["clip_norm"], data["clients_per_round"] = 1.0, 1.0
    if data["adaptive_clipping"]:  # σ_b must exceed σ/2 (and σ_Δ must be a float)
        sigma_b = data["clip_count_stddev"] or data["clients_per_round"] / 20
        try:
            update_noise_multiplier(data["noise_multiplier"], sigma_b)
        except ValueError:
            data["adaptive_clipping"] = False
    if data["noise_mechanism"] == "tree" and data["strategy"] == "dp-fedavg-adadp":
        data["noise_mechanism"] = "gaussian"
    if data["noise_mechanism"] == "tree" and data["strategy"] not in ("fedavg", "fedadam"):
        # tree aggregation: an integer cohort m, T·m <= N, server noise, fixed C, RDP
        m = data["clients_per_round"] = float(max(1, int(data["clients_per_round"])))
        data["tree_restart_rounds"] = draw(st.integers(0, population // int(m)))
        data.update(noise_mode="server", adaptive_clipping=False, accountant="rdp")
        data["sampling"] = "poisson"  # the tree samples nothing (fourteenth review, finding 5)
        data["clip_norm_adaptive"] = None  # DP2's second clip norm: one norm under the tree
        if not _finite_variance(data):
            data["clip_norm"] = 1.0
    elif data["noise_mechanism"] != "tree":  # a restart period without the tree is refused
        data["tree_restart_rounds"] = 0
    if not _noise_std_ok(data):  # the noise std of a round's sum must square to a float
        data["clip_norm"], data["clip_norm_adaptive"] = 1.0, None
        if not _noise_std_ok(data):  # a tiny clients-per-round (never under the tree)
            data.update(clients_per_round=1.0, adaptive_clipping=False)
    if not data["adaptive_clipping"]:  # its keys away from their defaults are refused without it
        data.update(ADAPTIVE_DEFAULTS)
    if data["noise_mode"] != "distributed":  # the share keys alike without distributed noise
        data.update(min_shares=0, min_shares_quantile=0.01)
    data["min_shares"] = min(data["min_shares"], population)  # twelfth review
    if data.get("adam_flavor") == "flower":  # Flower's FedAdam always corrects (eighteenth review)
        data["bias_correction"] = True
    mapping = {k.replace("_", "-"): v for k, v in data.items()}
    mapping.update(
        {
            "engine": draw(st.sampled_from(["fast", "flower"])),
            "task": draw(_BMP_TEXT),
            "eval-every": draw(st.integers(1, 10**9)),
            "checkpoint-every": draw(st.integers(1, 10**9)),
            "side-information": draw(st.sampled_from(["auto", "ones"])),
            "client-cpus": draw(st.floats(0, 1e6)),
            "client-gpus": draw(st.floats(0, 1e6)),
            "ray-cpus": draw(st.integers(0, 10**6)),
            "round-timeout": draw(st.floats(1, 1e9)),
            "device": draw(st.sampled_from(["auto", "cpu", "cuda", "cuda:0", "cuda:12"])),
        }
    )
    params = draw(
        st.dictionaries(
            st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.floats(allow_nan=False),
                st.booleans(),
                _BMP_TEXT,
            ),
            max_size=4,
        )
    )
    mapping.update({f"task-params.{k}": v for k, v in params.items()})
    return mapping


@FUZZ
@given(mapping=valid_mappings())
def test_valid_configs_round_trip_through_config_toml(tmp_path, mapping):
    count("config")
    config = resolve_config(mapping)
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config))
    again = load_config(path)
    assert again == config
    assert config_to_toml(again) == config_to_toml(config)


# Round-trip bugs of ``config_to_toml`` found by this fuzz (fixed in simulation/files.py).
ROUND_TRIP_BUGS = {
    "non-BMP text is written as a JSON surrogate pair, which TOML rejects": {
        "task": "toy\U0001f600"
    },
    "a NaN task parameter is written as -inf": {"task-params.x": math.nan},
    "a list task parameter comes back as a string": {"task-params.sizes": [16, 16]},
    "a task-parameter name that is not a bare TOML key is written unquoted": {
        "task-params.my key": 1
    },
}


@pytest.mark.parametrize("extra", ROUND_TRIP_BUGS.values(), ids=list(ROUND_TRIP_BUGS))
def test_round_trip_bugs_of_config_to_toml_are_fixed(tmp_path, extra):
    config = resolve_config({**BASE, **extra})
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config))
    again = load_config(path)
    assert config_to_toml(again) == config_to_toml(config)  # (NaN != NaN, so not ==)
    assert again.task_params.keys() == config.task_params.keys()
    for key, value in config.task_params.items():
        assert type(again.task_params[key]) is type(value)
        assert _numbers_equal(again.task_params[key], value) or again.task_params[key] == value
