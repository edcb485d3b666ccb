"""TLS material and SuperNode keys for a local deployment, made with ``cryptography``.

:func:`make_tls_files` writes a private certificate authority and a server certificate signed by
it (for the SuperLink, valid for the given loopback hosts); :func:`make_node_key` writes an EC
key pair in OpenSSH format for SuperNode authentication. Private keys are written with mode 0600
into a directory the caller owns (and deletes). Both are for local deployments and tests: a real
deployment uses certificates from the organization's CA (docs/DEPLOYMENT.md).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedprivopt.core.text import shown

__all__ = ["NodeKey", "TLSFiles", "make_node_key", "make_tls_files"]


@dataclass(frozen=True)
class TLSFiles:
    """Paths of the PEM files of a local deployment."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """Paths of a SuperNode's authentication key pair (OpenSSH format)."""

    private_key: Path
    public_key: Path


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new file of ``mode`` and rename it to ``path``; returns ``path``.

    Thirty-ninth review of issue 15 (processes 1): the file was opened by name with ``O_TRUNC``
    and written in place, then ``chmod``-ed, so a private key went through a symbolic link
    (``cp -rs certs certs-b``: the first directory's CA key and certificates replaced), into
    every name of a hard link (``cp -al``), and into an existing file of mode 0644 that another
    process had open (it read the key after the ``chmod``). The new file is created with
    ``O_EXCL`` (no link followed), its mode set before a byte is written, and renamed over
    ``path`` (a link there is replaced, never followed).
    """
    # not named after ``path``: a name that fits the file system's 255 bytes (a node key's
    # name of 240 characters) would not fit with a suffix (thirty-ninth review follow-up,
    # outputs 2: ENAMETOOLONG, where the file itself was written before)
    tmp = path.with_name(f".tls-{os.getpid()}-{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.fchmod(fd, mode)  # exactly mode, whatever the umask (as before)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


_DNS_NAME = re.compile(r"[A-Za-z0-9*]([A-Za-z0-9.*-]{0,251}[A-Za-z0-9])?")


def _check_hosts(hosts: object) -> None:
    """Refuse ``hosts`` that are not a sequence of IP addresses and DNS names.

    Thirty-seventh review of issue 15: ``make_tls_files(dir, hosts="10.0.0.5")`` (one host, as a
    string) made a certificate for the DNS names ``1``, ``0``, ``.`` and ``5``, on which every
    SuperNode's handshake with ``10.0.0.5`` fails; ``""``, ``"my host"`` and a name with a line
    break were written into the certificate as given.
    """
    if isinstance(hosts, (str, bytes)) or not isinstance(hosts, Sequence) or not hosts:
        raise ValueError(
            "hosts must be a non-empty sequence of IP addresses and DNS names (a list, not one "
            f"string), got {shown(hosts)}"
        )
    for host in hosts:
        if isinstance(host, str):
            with contextlib.suppress(ValueError):
                ipaddress.ip_address(host)
                continue
            if _DNS_NAME.fullmatch(host):
                continue
        raise ValueError(f"hosts: {shown(host)} is neither an IP address nor a DNS name")


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_tls_files(
    directory: str | Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 2,
) -> TLSFiles:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` (0600) into ``directory``.

    Parameters
    ----------
    directory : str or Path
        An existing directory (created with mode 0700 if missing).
    hosts : sequence of str
        IP addresses and DNS names the server certificate is valid for.
    days : int
        Validity of both certificates, ``>= 1``.
    """
    _check_hosts(hosts)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be an integer >= 1, got {days!r}")
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    try:  # thirty-seventh review of issue 15: OverflowError after the directory was made
        until = now + _dt.timedelta(days=days)
    except OverflowError:
        last = (_dt.datetime.max.replace(tzinfo=_dt.timezone.utc) - now).days
        raise ValueError(
            f"days must be an integer in [1, {last}] (a certificate ends by the year 9999), "
            f"got {days!r}"
        ) from None
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedprivopt local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    return TLSFiles(
        ca_cert=_write(out / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), 0o644),
        server_cert=_write(
            out / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644
        ),
        server_key=_write(out / "server.key", _private_pem(key), 0o600),
    )


def make_node_key(directory: str | Path, name: str) -> NodeKey:
    """Write a P-384 key pair for SuperNode authentication (``<name>`` and ``<name>.pub``).

    Flower's SuperNode reads the private key in OpenSSH format (``--auth-supernode-private-key``);
    ``flwr supernode register`` reads the public key in OpenSSH format.

    Raises
    ------
    ValueError
        Unless ``name`` is one file name (thirty-seventh review of issue 15: ``""`` and ``"."``
        raised ``IsADirectoryError``, ``"a/b"`` ``FileNotFoundError``, and ``"../x"`` wrote the
        private key outside ``directory``).
    """
    blank = not isinstance(name, str) or not name.strip() or name in (".", "..")
    if blank or "/" in name or os.sep in name or any(ord(ch) < 0x20 or ch == "\x7f" for ch in name):
        raise ValueError(f"name must be one file name (no directory), got {shown(name)}")
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return NodeKey(
        private_key=_write(out / name, private, 0o600),
        public_key=_write(out / f"{name}.pub", public + b"\n", 0o644),
    )
