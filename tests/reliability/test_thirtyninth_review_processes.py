"""Issue 15, thirty-ninth hostile review (processes: signals, locks, run and work directories,
deployment processes and key material): tests.

1. ``make_tls_files(D)`` or ``make_node_key(D, "node0")`` (docs/DEPLOYMENT.md: the certificates
   and node keys of one's own deployment) into a directory whose ``server.key``, ``ca.pem`` or
   ``node0`` already exists as a symbolic link (``cp -rs certs certs-b``, as the thirty-seventh
   review's ``.tmp`` links), as a hard link (``cp -al``), or as a file of mode 0644 that another
   process has open. Before: each file was opened with ``O_TRUNC`` by name and written in place,
   then ``chmod``-ed: the private key went through the link into the linked file (``certs``' CA
   key and certificates replaced: its running deployment's TLS broken, the linked file made
   0600), into every hard-linked name, and into an inode others could read (the reader kept
   the key after the ``chmod``). Now ``tls._write`` writes a new file (``O_EXCL``, no link
   followed, mode set before a byte is written) and renames it over the name: the linked or
   shared file is untouched and the key is in a file only its owner could ever read.
2. The Python API ``deploy_local(nodes=1, tls=False, config_path="toy.toml", out=D)``
   (docs/DEPLOYMENT.md: "It validates everything first") with ``D`` a directory of a user's
   files, or holding a user's own ``deploy/processes.json``. Before: ``deploy local`` refused
   both (rc 2), the API checked only that ``D`` held no ``config.toml``: it made ``D/deploy``,
   its lock and logs, started the SuperLink and the SuperNode (the ServerApp then refused
   ``D``, a ``RuntimeError`` about a minute later) and wrote its ``processes.json`` over the
   user's. Now ``deploy_local`` makes the command line's checks
   (``deploy.cli.check_out_claimable``: the claim, the ``deploy/`` logs, task and temporary
   directories outside ``D``) before anything is written: ``ValueError`` naming ``--out``.
3. ``compare … --overwrite`` (``NewRunDir(cell, overwrite=True)``, also a tuning's replan)
   interrupted, or killed, while it removed the old run's files (Ctrl-C, SIGKILL or a failed
   ``unlink`` after the first file). Before: ``config.toml`` went first, so the cell held a
   ledger, checkpoints and metrics but no ``config.toml``: neither ``--overwrite`` (``not
   recognisably a run``) nor ``--resume`` took it, and ``compare`` refused the whole ``--out``
   as holding a report it "did not write". Now ``rundir.remove_run_files`` removes the summary,
   checkpoints and metrics first, then the ledger and ``config.toml`` last: what an interrupted
   removal leaves is still a recognisable run, which the next overwrite replaces (a resume
   refuses it, as any run whose ledger shows rounds and no checkpoint).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fedprivopt.deploy.tls import make_node_key, make_tls_files

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


def test_1_tls_files_are_not_written_through_links(tmp_path):
    first = tmp_path / "certs"
    files = make_tls_files(first)
    before = {p: p.read_bytes() for p in first.iterdir()}
    copy = tmp_path / "certs-b"  # cp -rs certs certs-b
    copy.mkdir()
    for path in before:
        (copy / path.name).symlink_to(path)
    linked = tmp_path / "hard"  # cp -al certs hard
    linked.mkdir()
    for path in before:
        os.link(path, linked / path.name)
    new = make_tls_files(copy)
    make_tls_files(linked)
    assert {p: p.read_bytes() for p in first.iterdir()} == before
    assert stat.S_IMODE(files.ca_cert.stat().st_mode) == 0o644
    for path in (new.ca_cert, new.server_cert, new.server_key):
        assert not path.is_symlink() and path.read_bytes() != before[first / path.name]
    assert stat.S_IMODE(new.server_key.stat().st_mode) == 0o600


def test_1_a_private_key_never_lands_in_a_readable_file(tmp_path):
    key = tmp_path / "node0"
    key.write_text("old\n")
    key.chmod(0o644)
    with open(key, "rb") as reader:  # another user's descriptor, opened while it was 0644
        made = make_node_key(tmp_path, "node0")
        assert reader.read() == b"old\n"
    assert b"PRIVATE KEY" in made.private_key.read_bytes()
    assert stat.S_IMODE(made.private_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.public_key.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


class _Started(Exception):
    """Raised where the deployment would make its working directory and start its processes."""


@pytest.fixture
def no_deployment(monkeypatch):
    import fedprivopt.deploy.local as local

    def started() -> None:
        raise _Started

    monkeypatch.setattr(local, "make_workdir", started)


@pytest.mark.parametrize("case", ["user files", "user deploy dir"])
def test_2_deploy_local_refuses_an_out_of_user_files_before_writing(tmp_path, no_deployment, case):
    from fedprivopt.deploy import deploy_local

    out = tmp_path / "D"
    if case == "user files":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
        expected = "not part of a fedprivopt run"
    else:
        (out / "deploy").mkdir(parents=True)
        (out / "deploy" / "processes.json").write_text('{"mine": 1}\n')
        expected = "processes.json"
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(ValueError, match=expected):
        deploy_local(nodes=1, tls=False, config_path=str(TOY), out=str(out), timeout=60)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_3_an_interrupted_overwrite_leaves_a_run_the_next_overwrite_takes(tmp_path, monkeypatch):
    from fedprivopt.simulation import rundir

    cell = tmp_path / "cell"
    cell.mkdir()
    for name in rundir.RUN_FILES:
        (cell / name).write_text("x\n")
    real = os.unlink
    calls = []

    def interrupted_unlink(path, *args, **kwargs):
        calls.append(os.path.basename(path))
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C (or a kill) while the old run is removed
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", interrupted_unlink)
    with pytest.raises(KeyboardInterrupt):
        with rundir.NewRunDir(cell, overwrite=True):
            pass  # pragma: no cover
    monkeypatch.setattr(os, "unlink", real)
    assert (cell / "config.toml").exists() and (cell / "privacy_ledger.jsonl").exists()
    rundir.check_claimable(cell, overwrite=True)  # still a run: the next overwrite takes it
    with rundir.NewRunDir(cell, overwrite=True) as path:
        assert sorted(os.listdir(path)) == ["run.lock"]
