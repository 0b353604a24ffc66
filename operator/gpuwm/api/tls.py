"""The API's HTTPS certificate: from files (the chart mounts a Secret there), kept in a Secret, or made at start.

Users send Kubernetes bearer tokens to the API, so it speaks HTTPS unless told not to
(`--api-tls=false`, for `gpuwm demo` and tests on 127.0.0.1). Three sources, first match wins:

- files (`--api-tls-cert-file`/`--api-tls-key-file`): cert-manager's or your own Secret, mounted;
- a Secret the controller keeps itself (`--api-tls-secret`, the chart's default): it makes a small
  CA and a leaf certificate for the Service's names once, stores both in a `kubernetes.io/tls` Secret,
  and reuses them at every start, so clients (and the ServiceMonitor) can verify the API with the
  Secret's `ca.crt` and the certificate survives restarts. The leaf is renewed with the same CA
  when it nears its end or the names change, so a client that trusts `ca.crt` keeps working;
- neither (`gpuwm api` outside a cluster): a self-signed certificate made at start, in memory and a
  private temporary folder: encrypted, but nothing a client can pin.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import socket
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.x509 import Certificate, ExtensionType, Name

log = logging.getLogger(__name__)

#: a kept leaf certificate is replaced once it has less than this left (cert-manager renews at a third of
#: its life; 30 days leaves a month of restarts to notice a failing renewal in the log)
RENEW_BEFORE = datetime.timedelta(days=30)
LEAF_LIFETIME = datetime.timedelta(days=365)
#: the CA outlives many leaves: a client that trusts ca.crt keeps working across leaf renewals
CA_LIFETIME = datetime.timedelta(days=3650)
SECRET_TYPE = "kubernetes.io/tls"


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    self_signed: bool = False


class TlsError(ValueError):
    """A TLS option that cannot work; the message names it."""


#: how the controller is given a certificate its clients can verify (named where it makes a self-signed one)
CONTROLLER_CERTIFICATE_OPTIONS = "--api-tls-cert-file and --api-tls-key-file, or --api-tls-secret"
#: the same for `gpuwm api`, which keeps no Secret
API_CERTIFICATE_OPTIONS = "--api-tls-cert-file and --api-tls-key-file (a mounted kubernetes.io/tls Secret)"


def tls_files(
    enabled: bool, cert_file: str, key_file: str, host: str,
    certificate_options: str = CONTROLLER_CERTIFICATE_OPTIONS,
) -> TlsFiles | None:
    """The certificate and key to serve with, or None for plain HTTP (`enabled` false); a self-signed one
    names `certificate_options`, the verb's way to a certificate clients can verify."""
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
    return self_signed(host, certificate_options)


def self_signed(host: str, certificate_options: str = CONTROLLER_CERTIFICATE_OPTIONS) -> TlsFiles:
    """A fresh key and a certificate for `host`, this machine's name and localhost, valid a year; the
    warning names `certificate_options`, how the serving verb is given a certificate instead."""
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
    certificate = _certificate(subject, subject, key, key, now, now + datetime.timedelta(days=365), [
        (x509.SubjectAlternativeName(names), False), (x509.BasicConstraints(ca=False, path_length=None), True)])
    files = _write_private(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key), self_signed=True)
    log.warning(
        "metrics API: serving HTTPS with a self-signed certificate made now (SHA-256 %s), which clients cannot "
        "verify; give it a certificate with %s",
        certificate.fingerprint(hashes.SHA256()).hex(":"), certificate_options,
    )
    return files


def _write_private(cert_pem: bytes, key_pem: bytes, *, self_signed: bool) -> TlsFiles:
    """The PEMs in a fresh private folder (ssl loads certificates from files only)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuwm-tls-"))  # mode 0700: the key is readable by this user only
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(cert_pem)
    key_path.touch(mode=0o600)
    key_path.write_bytes(key_pem)
    return TlsFiles(str(cert_path), str(key_path), self_signed=self_signed)


def _certificate(
    subject: Name, issuer: Name, key: EllipticCurvePrivateKey, signer: EllipticCurvePrivateKey,
    now: datetime.datetime, not_after: datetime.datetime, extensions: Sequence[tuple[ExtensionType, bool]],
) -> Certificate:
    """`key`'s certificate for `subject`, from five minutes before `now` (clocks drift) to `not_after`, with
    `extensions` (each with whether it is critical), signed by `signer` for `issuer`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _key_pem(key: EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


# --- the certificate kept in a Secret -------------------------------------------------------------------------


class SecretClient(Protocol):
    """The calls of the controller's Kubernetes client this needs (gpuwm.controller.kube.client.KubeClient).

    `get` answers None for a missing object; failures raise an exception with the HTTP `status`.
    """

    async def get(self, path: str) -> dict[str, Any] | None: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class KeptCertificate:
    """PEMs as the Secret holds them: the leaf (tls.crt, tls.key) and the CA that signed it (ca.crt, ca.key)."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    ca_key_pem: bytes

    def secret_data(self) -> dict[str, str]:
        return {key: base64.b64encode(value).decode() for key, value in (
            ("tls.crt", self.cert_pem), ("tls.key", self.key_pem), ("ca.crt", self.ca_pem), ("ca.key", self.ca_key_pem))}

    @classmethod
    def from_secret_data(cls, data: Mapping[str, Any]) -> KeptCertificate:
        """The PEMs of a Secret's `data` (ValueError naming a missing or undecodable key)."""
        found: dict[str, bytes] = {}
        for key in ("tls.crt", "tls.key", "ca.crt", "ca.key"):
            value = data.get(key)
            if not value:
                raise ValueError(f"it has no {key}")
            try:
                found[key] = base64.b64decode(str(value), validate=True)
            except ValueError:
                raise ValueError(f"its {key} is not base64") from None
        return cls(found["tls.crt"], found["tls.key"], found["ca.crt"], found["ca.key"])

    def fingerprint(self, pem: bytes) -> str:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes

        return x509.load_pem_x509_certificate(pem).fingerprint(hashes.SHA256()).hex(":")


def make_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    """A new CA: (certificate PEM, key PEM), valid CA_LIFETIME, able to sign server certificates only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuwm-api-ca")])
    certificate = _certificate(subject, subject, key, key, now, now + CA_LIFETIME, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                       key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), True),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
    ])
    return certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_leaf(ca_pem: bytes, ca_key_pem: bytes, dns_names: Sequence[str], now: datetime.datetime) -> tuple[bytes, bytes]:
    """A server certificate for `dns_names` (and localhost) signed by the CA: (certificate PEM, key PEM).

    It ends with the CA at the latest, so a kept pair never holds a leaf its CA no longer vouches for.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("its ca.key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    names = list(dict.fromkeys([*dns_names, "localhost"]))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])])
    certificate = _certificate(subject, ca.subject, key, ca_key, now, min(now + LEAF_LIFETIME, ca.not_valid_after_utc), [
        (x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ])
    return certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _ca_problem(ca_pem: bytes, ca_key_pem: bytes, now: datetime.datetime) -> str | None:
    """Why the CA cannot sign a new leaf (None: it can)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if ca_key.public_key() != ca.public_key():
        return "its ca.key does not belong to its ca.crt"
    if ca.not_valid_after_utc - now < RENEW_BEFORE:
        return f"its CA ends {ca.not_valid_after_utc:%Y-%m-%d}"
    return None


def kept_problem(kept: KeptCertificate, dns_names: Sequence[str], now: datetime.datetime) -> str | None:
    """Why the kept certificate must be replaced (None: serve it): a key that is not the certificate's,
    a leaf its CA did not sign, a name of the API it does not cover, or less than RENEW_BEFORE left."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    leaf = x509.load_pem_x509_certificate(kept.cert_pem)
    ca = x509.load_pem_x509_certificate(kept.ca_pem)
    if serialization.load_pem_private_key(kept.key_pem, password=None).public_key() != leaf.public_key():
        return "its tls.key does not belong to its tls.crt"
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as error:
        return f"its tls.crt is not signed by its ca.crt ({error or type(error).__name__})"
    try:
        covered = set(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                      .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        covered = set()
    missing = [name for name in dns_names if name not in covered]
    if missing:
        return f"its certificate does not name {', '.join(missing)}"
    if leaf.not_valid_before_utc > now:
        return f"its certificate starts only {leaf.not_valid_before_utc:%Y-%m-%d %H:%M}"
    if leaf.not_valid_after_utc - now < RENEW_BEFORE:
        return f"its certificate ends {leaf.not_valid_after_utc:%Y-%m-%d}"
    return None


def _renewed(found: Mapping[str, Any], dns_names: Sequence[str], now: datetime.datetime) -> tuple[KeptCertificate, bool]:
    """A new leaf for `dns_names`, signed by the Secret's CA where that can still sign, else by a new CA;
    and whether the CA is new (clients that trust the old ca.crt must be given the new one)."""
    try:
        old = KeptCertificate.from_secret_data(found)
        if _ca_problem(old.ca_pem, old.ca_key_pem, now) is None:
            cert_pem, key_pem = make_leaf(old.ca_pem, old.ca_key_pem, dns_names, now)
            return KeptCertificate(cert_pem, key_pem, old.ca_pem, old.ca_key_pem), False
    except ValueError:
        pass
    ca_pem, ca_key_pem = make_ca(now)
    cert_pem, key_pem = make_leaf(ca_pem, ca_key_pem, dns_names, now)
    return KeptCertificate(cert_pem, key_pem, ca_pem, ca_key_pem), True


async def _written(write: Awaitable[object]) -> bool:
    """Whether `write` went through; False where another writer got there first (409: read the Secret again)."""
    try:
        await write
    except Exception as error:
        if getattr(error, "status", None) == 409:
            return False
        raise
    return True


async def kept_in_secret(
    client: SecretClient, namespace: str, name: str, dns_names: Sequence[str], *,
    now: datetime.datetime | None = None,
) -> tuple[TlsFiles, KeptCertificate]:
    """The API's certificate from the Secret `namespace/name`, made (and stored there) when it is missing
    or must be replaced (`kept_problem`); the files to serve it from and the PEMs.

    Two replicas starting at once: one create or patch wins (AlreadyExists, or Conflict on the
    resourceVersion), the other reads the winner's certificate and serves that one.
    """
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    where = f"Secret {namespace}/{name}"
    for _ in range(3):
        moment = now or datetime.datetime.now(datetime.UTC)
        secret = await client.get(path)
        if secret is not None:
            kind = secret.get("type")
            if kind != SECRET_TYPE:
                raise TlsError(f"{where} is of type {kind!r}, not {SECRET_TYPE}: delete it, or name another "
                               "with --api-tls-secret")
            data = secret.get("data") or {}
            try:
                kept = KeptCertificate.from_secret_data(data)
                problem = kept_problem(kept, dns_names, moment)
            except ValueError as error:
                problem = str(error)
            if problem is None:
                log.info("metrics API: serving the certificate kept in %s (CA SHA-256 %s)", where,
                         kept.fingerprint(kept.ca_pem))
                return _write_private(kept.cert_pem, kept.key_pem, self_signed=False), kept
            kept, new_ca = _renewed(data, dns_names, moment)
            # the resourceVersion makes the patch fail (409) if another replica changed the Secret since the read
            body: dict[str, Any] = {"metadata": {"resourceVersion": (secret.get("metadata") or {}).get("resourceVersion")},
                                    "data": kept.secret_data()}
            if not await _written(client.merge_patch(path, body)):
                continue
            log.warning("metrics API: %s could not be served (%s); made a new certificate%s and stored it there "
                        "(CA SHA-256 %s)", where, problem,
                        " and a new CA: clients must trust its new ca.crt" if new_ca else " signed by its CA",
                        kept.fingerprint(kept.ca_pem))
            return _write_private(kept.cert_pem, kept.key_pem, self_signed=False), kept
        kept, _ = _renewed({}, dns_names, moment)
        body = {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "gpuwm",
                                        "app.kubernetes.io/component": "controller"}},
                "data": kept.secret_data()}
        if not await _written(client.create(f"/api/v1/namespaces/{namespace}/secrets", body)):
            continue
        log.info("metrics API: made a CA and a certificate for %s and stored them in %s (CA SHA-256 %s); clients "
                 "verify the API with its ca.crt", ", ".join(dns_names) or "localhost", where,
                 kept.fingerprint(kept.ca_pem))
        return _write_private(kept.cert_pem, kept.key_pem, self_signed=False), kept
    raise TlsError(f"{where} changed under each of 3 attempts to read or write it (another writer?)")
