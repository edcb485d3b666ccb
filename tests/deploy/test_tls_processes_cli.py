"""TLS material, the process set (nothing left behind) and the command line, without Flower."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedprivopt.deploy import deploy_local
from fedprivopt.deploy.cli import add_deploy_subcommand, run_deploy_command
from fedprivopt.deploy.processes import ProcessSet, pid_alive
from fedprivopt.deploy.tls import make_node_key, make_tls_files

# -- TLS -------------------------------------------------------------------------------------------


def test_tls_files_chain_permissions_and_handshake(tmp_path):
    files = make_tls_files(tmp_path / "tls")
    assert stat.S_IMODE(os.stat(files.server_key).st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}

    # a real handshake on loopback, verified against the CA
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files.server_cert, files.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(tls.recv(5))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"hello")
            assert tls.recv(5) == b"hello"
    thread.join(5)
    listener.close()

    # a client that does not trust our CA refuses the server
    other = make_tls_files(tmp_path / "other")
    untrusting = ssl.create_default_context(cafile=str(other.ca_cert))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_once() -> None:
        conn, _ = listener.accept()
        try:
            server_ctx.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            conn.close()

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.wrap_socket(raw, server_hostname="127.0.0.1")
    thread.join(5)
    listener.close()


def test_node_keys_are_what_flower_reads(tmp_path):
    key = make_node_key(tmp_path, "node-0")
    assert stat.S_IMODE(os.stat(key.private_key).st_mode) == 0o600
    private = load_ssh_private_key(key.private_key.read_bytes(), None)
    public = load_ssh_public_key(key.public_key.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert public.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()


def test_tls_input_checks(tmp_path):
    with pytest.raises(ValueError, match="hosts"):
        make_tls_files(tmp_path, hosts=())
    with pytest.raises(ValueError, match="days"):
        make_tls_files(tmp_path, days=0)


# -- processes -------------------------------------------------------------------------------------

# a parent that, like Flower's SuperLink, starts a child in a new session and then waits
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_process_set_stops_detached_grandchildren(tmp_path):
    procs = ProcessSet(dict(os.environ), tmp_path)
    parent = procs.start("superlink", [sys.executable, "-c", _PARENT], "parent")
    log = tmp_path / "parent.log"
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    assert pid_alive(child)
    procs.stop(grace=5)
    assert parent.poll() is not None
    assert not pid_alive(child)
    roles = {r["pid"]: r["started_by"] for r in procs.records()}
    assert roles == {parent.pid: "fedprivopt", child: "flower"}
    procs.stop()  # idempotent
    with pytest.raises(RuntimeError):
        procs.start("again", [sys.executable, "-c", "pass"], "again")


def test_process_set_reports_dead_processes(tmp_path):
    procs = ProcessSet(dict(os.environ), tmp_path)
    try:
        p = procs.start("supernode", [sys.executable, "-c", "raise SystemExit(3)"], "node")
        p.wait(30)
        assert procs.dead() == [("supernode", 3, tmp_path / "node.log")]
        assert procs.dead(("superlink",)) == []
    finally:
        procs.stop()


# -- command line ----------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fedprivopt")
    add_deploy_subcommand(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--nodes", "x"], "--nodes"),
        (["--nodes", "0"], "--nodes"),
        (["--nodes", "2", "--timeout", "-1"], "--timeout"),
        (["--nodes", "2", "--set", "noequals"], "--set"),
        (["--nodes", "2", "--set", "out=/tmp/x"], "--out"),
        (["--nodes", "2", "--set", "bogus=1"], "bogus"),
        (["--nodes", "2", "--set", "noise-multiplier=-1"], "noise-multiplier"),
        (["--nodes", "2", "--rounds", "0"], "--rounds"),
        (["--nodes", "2", "--seed", "-3"], "--seed"),
        (["--nodes", "2", "missing.toml"], "missing.toml"),
    ],
)
def test_bad_input_raises_value_error_naming_the_flag(argv, flag):
    args = _parse(["deploy", "local", *argv])
    assert args.func is run_deploy_command
    with pytest.raises(ValueError, match=flag.replace("-", r"\-")):
        run_deploy_command(args)


def test_tls_and_insecure_exclude_each_other():
    with pytest.raises(SystemExit):
        _parse(["deploy", "local", "--nodes", "2", "--tls", "--insecure"])


def test_deploy_without_target_is_a_usage_error():
    args = _parse(["deploy"])
    with pytest.raises(ValueError, match="deploy local"):
        run_deploy_command(args)


def test_deploy_local_refuses_bad_arguments_before_starting_anything(tmp_path):
    (tmp_path / "config.toml").write_text("")
    with pytest.raises(ValueError, match="--out"):
        deploy_local(nodes=1, out=str(tmp_path), timeout=10)
    with pytest.raises(ValueError, match="--node-auth"):
        deploy_local(nodes=1, tls=False, node_auth=True, out=str(tmp_path / "a"), timeout=10)
    with pytest.raises(ValueError, match="population"):
        deploy_local(nodes=1, overrides={"population": 7}, out=str(tmp_path / "b"), timeout=10)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_flower_commands_exist():
    bin_dir = os.path.dirname(sys.executable)
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        path = os.path.join(bin_dir, name)
        if not os.path.exists(path):
            pytest.skip(f"{name} not installed next to the interpreter")
    out = subprocess.run(
        [os.path.join(bin_dir, "flower-superlink"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    # the flags deploy_local relies on
    for flag in ("--ssl-ca-certfile", "--enable-supernode-auth", "--disable-runtime-dependency"):
        assert flag in out


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_deployment_exits_128_plus_the_signal(
    tmp_path, monkeypatch, capsys, sig, code
):
    # deploy's own SIGTERM/SIGHUP handler (a copy of simulate's) made SIGTERM exit 130; it uses
    # simulate's now, whose exception carries the signal
    from fedprivopt.deploy import local
    from fedprivopt.simulation.interrupt import Interrupted

    def interrupted(*args, **kwargs):
        raise Interrupted(sig)

    monkeypatch.setattr(local, "deploy_local", interrupted)
    args = _parse(["deploy", "local", "--nodes", "2", "--out", str(tmp_path / "out")])
    assert run_deploy_command(args) == code
    assert "interrupted" in capsys.readouterr().err
