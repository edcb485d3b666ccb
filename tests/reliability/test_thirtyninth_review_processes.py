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
"""

from __future__ import annotations

import os
import stat

from fedprivopt.deploy.tls import make_node_key, make_tls_files


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
