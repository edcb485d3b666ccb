"""ray-address and RAY_ADDRESS: validation, which runs join, the checks made before a run."""

import socket
from pathlib import Path

import pytest

from fedprivopt.simulation.cluster import check_reports, data_fingerprint, join_cluster
from fedprivopt.simulation.cluster_config import check_address, cluster_address
from fedprivopt.simulation.config import resolve_config
from fedprivopt.simulation.engines import check_flower_cluster, check_flower_resources
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_misuse_cli import SMALL, TOY, usage_error


def config(**extra):
    data = {"task": "toy", "population": 12, "clients-per-round": 4}
    data.update(extra)
    return resolve_config(data)


@pytest.mark.parametrize(
    "value", ["", "local", "auto", "10.0.0.1:6379", "head-node.lan:1", "[::1]:6379"]
)
def test_valid_addresses(value):
    assert check_address(value) == value
    assert config(**{"ray-address": value, "engine": "flower"}).ray_address == value


@pytest.mark.parametrize(
    "value", ["nonsense", "host:0", "host:65536", "host:", ":6379", "ray://h:10001", 6379, True]
)
def test_a_bad_address_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match="ray-address must be"):
        config(**{"ray-address": value, "engine": "flower"})


def test_ray_client_addresses_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="Ray Client is not supported"):
        check_address("ray://head:10001")


def test_which_runs_join(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flower = {"engine": "flower"}
    assert cluster_address(config(**flower)) is None
    assert cluster_address(config(**flower, **{"ray-address": "h:1"})) == ("h:1", "ray-address")
    # a run that uses no Ray joins nothing: RAY_ADDRESS is ignored, ray-address refused
    monkeypatch.setenv("RAY_ADDRESS", "envhost:2")
    assert cluster_address(config()) is None
    with pytest.raises(ValueError, match="ray-address 'h:1' is used only by the flower engine"):
        config(**{"ray-address": "h:1"})
    assert cluster_address(config(**{"ray-address": "local"})) is None
    monkeypatch.delenv("RAY_ADDRESS")
    assert cluster_address(config(**{"ray-address": "h:1", "fast-actors": 2}))[0] == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "envhost:2")
    address, key = cluster_address(config(**flower))
    assert address == "envhost:2" and key.startswith("RAY_ADDRESS")
    assert cluster_address(config(**flower, **{"ray-address": "local"})) is None  # key wins
    assert cluster_address(config(**flower, **{"ray-address": "h:1"}))[0] == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "not an address")
    with pytest.raises(ValueError, match=r"RAY_ADDRESS .*must be"):
        cluster_address(config(**flower))


def test_checks_before_a_run_that_joins(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    joining = {"engine": "flower", "ray-address": "h:1"}
    with pytest.raises(ValueError, match="ray-cpus must be 0 when joining"):
        check_flower_resources(config(**joining, **{"ray-cpus": 1}))
    relative = {"task-params": {"data-dir": "data/so"}}
    with pytest.raises(ValueError, match=r"task-params\.data-dir must be an absolute path"):
        check_flower_resources(config(**joining, **relative))
    check_flower_resources(config(**relative))  # a private Ray instance: relative is fine
    # this machine's CPUs and GPUs do not bound a cluster's clients (its nodes do, on joining)
    check_flower_resources(config(**joining, **{"client-cpus": 4096.0, "client-gpus": 8.0}))


def test_nothing_listening_is_refused_at_once_naming_the_key(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as probe:  # a free port, closed again: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    joining = config(**{"engine": "flower", "ray-address": f"127.0.0.1:{port}"})
    with pytest.raises(
        ValueError, match=f"ray-address: no Ray cluster answers at 127.0.0.1:{port}"
    ):
        with join_cluster(joining):
            pass


def test_the_command_line_exits_2_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = str(tmp_path / "run")
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", out, *SMALL]
    usage_error(run_cli([*argv, "--set", "ray-address=nowhere"]), "ray-address must be")
    usage_error(
        run_cli(
            [*argv, "--set", "engine=flower", "--set", "ray-address=h:1", "--set", "ray-cpus=1"]
        ),
        "ray-cpus must be 0",
    )
    monkeypatch.setenv("RAY_ADDRESS", "ray://h:10001")
    usage_error(run_cli([*argv, "--set", "engine=flower"]), "RAY_ADDRESS")
    assert not Path(out).exists()


def _report(data, versions="fedprivopt 1, torch 2, Python 3.11"):
    return {"host": "h", "versions": versions, "data": data}


def test_node_reports_are_compared_with_this_machine(tmp_path):
    (tmp_path / "a.sqlite").write_bytes(b"x" * 10)
    (tmp_path / ".cache").mkdir()
    ours = data_fingerprint(tmp_path)
    assert ours["files"] == 1 and ours["bytes"] == 10
    (tmp_path / ".lock").write_text("hidden files are not data")
    assert data_fingerprint(tmp_path) == ours
    assert data_fingerprint(tmp_path / "missing") is None
    local = _report(ours)
    check_reports(local, {"n1": _report(ours), "n2": _report(ours)}, str(tmp_path), "ray-address")
    with pytest.raises(ValueError, match=r"task-params\.data-dir: the node n2 sees no directory"):
        check_reports(local, {"n1": _report(ours), "n2": _report(None)}, "/d", "ray-address")
    (tmp_path / "a.sqlite").write_bytes(b"y" * 10)  # same size, other bytes
    other = data_fingerprint(tmp_path)
    assert other != ours
    with pytest.raises(ValueError, match=r"task-params\.data-dir: the node n1 sees other data"):
        check_reports(local, {"n1": _report(other)}, "/d", "ray-address")
    with pytest.raises(ValueError, match="ray-address: the node n1 runs fedprivopt 0"):
        check_reports(
            local, {"n1": _report(ours, "fedprivopt 0, torch 2, Python 3.11")}, None, "ray-address"
        )


def test_flower_client_resources_are_checked_against_the_nodes():
    from fedprivopt.simulation.cluster import Cluster

    nodes = {"a": {"ip": "1", "cpus": 4.0, "gpus": 0}, "b": {"ip": "2", "cpus": 2.0, "gpus": 1}}
    cluster = Cluster("h:1", "ray-address", nodes)
    check_flower_cluster(config(**{"client-cpus": 4.0}), cluster)
    check_flower_cluster(config(**{"client-cpus": 2.0, "client-gpus": 1.0}), cluster)
    with pytest.raises(ValueError, match=r"client-cpus must be a number in \(0, 4\]"):
        check_flower_cluster(config(**{"client-cpus": 8.0}), cluster)
    with pytest.raises(ValueError, match=r"client-cpus must be a number in \(0, 4\]"):
        check_flower_cluster(config(**{"client-cpus": 0.0}), cluster)
    with pytest.raises(ValueError, match=r"client-gpus must be a number in \[0, 0\]"):
        check_flower_cluster(config(**{"client-cpus": 3.0, "client-gpus": 1.0}), cluster)
