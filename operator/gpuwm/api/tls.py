"""The API's HTTPS certificate: from files (the chart mounts a Secret there), else self-signed at start.

Users send Kubernetes bearer tokens to the API, so it speaks HTTPS unless told not to
(`--api-tls=false`, for `gpuwm demo` and tests on 127.0.0.1). In a cluster the chart gives it a
certificate from a Secret (one it generates, one cert-manager issues, or your own); without
files, the process makes a self-signed certificate at start and keeps it in memory and a private
temporary folder: the traffic is encrypted, but clients cannot verify who answers, so give it a
real one wherever tokens matter.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    self_signed: bool = False


class TlsError(ValueError):
    """A TLS option that cannot work; the message names it."""


def tls_files(enabled: bool, cert_file: str, key_file: str, host: str) -> TlsFiles | None:
    """The certificate and key to serve with, or None for plain HTTP (`enabled` false)."""
    if not enabled:
        return None
    if bool(cert_file) != bool(key_file):
        raise TlsError(
            "--api-tls-cert-file and --api-tls-key-file (env GPUWM_API_TLS_CERT_FILE, GPUWM_API_TLS_KEY_FILE) "
            "go together: give both, or neither for a self-signed certificate"
        )
    if cert_file:
        for flag, path in (("--api-tls-cert-file", cert_file), ("--api-tls-key-file", key_file)):
            if not Path(path).is_file():
                raise TlsError(f"{flag} {path!r}: no such file (mount the TLS Secret there, or --api-tls=false)")
        return TlsFiles(cert_file, key_file)
    return self_signed(host)


def self_signed(host: str) -> TlsFiles:
    """A fresh key and a certificate for `host`, this machine's name and localhost, valid a year."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName(socket.gethostname())]
    for address in {"127.0.0.1", "::1", host}:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            if address:
                names.append(x509.DNSName(address))
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuwm-api")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = Path(tempfile.mkdtemp(prefix="gpuwm-tls-"))  # mode 0700: the key is readable by this user only
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    fingerprint = certificate.fingerprint(hashes.SHA256()).hex(":")
    log.warning(
        "metrics API: no --api-tls-cert-file; serving HTTPS with a self-signed certificate made now "
        "(SHA-256 %s); clients cannot verify it: give the API a certificate from a Secret",
        fingerprint,
    )
    return TlsFiles(str(cert_path), str(key_path), self_signed=True)
