"""A throwaway CA, a serving certificate for 127.0.0.1 and a client certificate, as kubeadm makes them.

A real API server speaks HTTPS with its own CA and most test clusters authenticate the admin
with a client certificate (`client-certificate-data` in the kubeconfig); the emulator can do
the same so the controller's TLS set-up (kopf's and its own client's) is exercised.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pem:
    certificate: bytes
    key: bytes


@dataclass
class TestPki:
    ca: Pem
    server: Pem
    client: Pem
    directory: Path

    def server_context(self) -> ssl.SSLContext:
        """Serves 127.0.0.1 and requires a client certificate signed by the CA (like --client-ca-file)."""
        cert, key, ca = self._files("server")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """Trusts the CA and presents the admin client certificate (the test's own calls)."""
        cert, key, ca = self._files("client")
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        return context

    def _files(self, name: str) -> tuple[Path, Path, Path]:
        pem = self.server if name == "server" else self.client
        cert, key, ca = (self.directory / f"{name}.crt", self.directory / f"{name}.key", self.directory / "ca.crt")
        cert.write_bytes(pem.certificate)
        key.write_bytes(pem.key)
        ca.write_bytes(self.ca.certificate)
        return cert, key, ca


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def make_pki(directory: Path) -> TestPki:
    """A CA, a server certificate for 127.0.0.1/localhost, and an admin client certificate."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("kubeemu-ca")).issuer_name(_name("kubeemu-ca"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True)
               .sign(ca_key, hashes.SHA256()))

    def issue(common_name: str, organization: str | None, server: bool) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, organization))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        certificate = builder.sign(ca_key, hashes.SHA256())
        return Pem(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    directory.mkdir(parents=True, exist_ok=True)
    return TestPki(
        ca=Pem(ca_cert.public_bytes(serialization.Encoding.PEM), _key_pem(ca_key)),
        server=issue("kube-apiserver", None, server=True),
        client=issue("kubernetes-admin", "system:masters", server=False),
        directory=directory,
    )
