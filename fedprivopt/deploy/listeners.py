"""Whose is the socket listening on a port: the processes of a deployment, or another's.

:func:`~fedprivopt.deploy.session.free_ports` picks a free port by binding and closing it; the
SuperLink binds it seconds later (Flower's start-up), and a connection to it proves only that
*something* listens there. Fortieth review of issue 15 (processes 2): ``session.wait_port``
took any listener on the SuperLink's port for the SuperLink, so a process that bound the port
in that window (another deployment's SuperLink, any local server) would have received the
SuperNodes and ``flwr run`` of this deployment. :func:`foreign_listeners` reads the kernel's
tables on Linux: the listening sockets on the port (``/proc/self/net/tcp``, ``tcp6``) against
the sockets the deployment's processes hold open (``/proc/<pid>/fd``). Where ``/proc`` is
missing or unreadable nothing is known (``None``), and the caller falls back to the connection.
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = ["foreign_listeners", "listening_inodes", "socket_inodes"]

_PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of ``/proc/net/tcp`` or ``tcp6``: hex 32-bit words, each in host order."""
    words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    return ipaddress.ip_address(raw)


def _reaches(address: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str) -> bool:
    """Whether a listener bound to ``address`` takes connections made to ``host``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_unspecified or address == ipaddress.ip_address(host)


def listening_inodes(port: int, host: str, proc: Path = _PROC) -> set[int] | None:
    """Socket inodes listening on ``host:port`` (or on every address); ``None`` if unknown."""
    found: set[int] = set()
    read_any = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "self" / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local, _, hex_port = fields[1].partition(":")
            try:
                if int(hex_port, 16) != port or not _reaches(_address(local), host):
                    continue
                found.add(int(fields[9]))
            except ValueError:
                continue
    return found if read_any else None


def socket_inodes(pids: Iterable[int], proc: Path = _PROC) -> set[int]:
    """Inodes of the sockets processes ``pids`` hold open (those whose ``fd`` can be read)."""
    found: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(proc / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(proc / str(pid) / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                found.add(int(target[8:-1]))
    return found


def foreign_listeners(port: int, host: str, pids: Iterable[int]) -> set[int] | None:
    """Inodes of the sockets listening on ``host:port`` that none of ``pids`` holds.

    ``None`` where the kernel's tables cannot be read (no ``/proc``: not Linux), or where they
    show no listener at all (the connection that found one went elsewhere than they say).
    """
    listening = listening_inodes(port, host)
    if not listening:
        return None
    return listening - socket_inodes(pids)
