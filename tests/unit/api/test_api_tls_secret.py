"""The API's certificate kept in a Secret: made once (a CA and a leaf for the Service's names),
reused at every start, renewed with the same CA when due or when the names change, a new CA only when the old
one cannot sign; two replicas racing serve one certificate; a Secret that cannot be used is named."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import logging
import socket
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from gpuwm.api.tls import (
    CA_LIFETIME,
    KeptCertificate,
    TlsError,
    TlsFiles,
    kept_in_secret,
    make_ca,
    make_leaf,
)
from gpuwm.config import Settings

NS, NAME = "gpuwm", "gpuwm-controller-tls"
PATH = f"/api/v1/namespaces/{NS}/secrets/{NAME}"
NAMES = ["gpuwm-controller", "gpuwm-controller.gpuwm", "gpuwm-controller.gpuwm.svc",
         "gpuwm-controller.gpuwm.svc.cluster.local"]
T0 = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class FakeSecrets:
    """Secrets as the API server keeps them: resourceVersion checked on patch, AlreadyExists on create."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.before_write: list[Any] = []  # callables run before the next write (another replica's)

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        self.calls.append(f"GET {path}")
        found = self.objects.get(path)
        return copy.deepcopy(found) if found is not None else None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(f"POST {path}")
        while self.before_write:
            self.before_write.pop(0)()
        target = f"{path}/{body['metadata']['name']}"
        if target in self.objects:
            raise ApiError(409, "AlreadyExists")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._bump()
        self.objects[target] = stored
        return copy.deepcopy(stored)

    async def merge_patch(self, path: str, body: Mapping[str, Any], *, nan_as_null: bool = False) -> dict[str, Any] | None:
        self.calls.append(f"PATCH {path}")
        while self.before_write:
            self.before_write.pop(0)()
        stored = self.objects[path]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict")
        stored["data"] = {**stored.get("data", {}), **body["data"]}
        stored["metadata"]["resourceVersion"] = self._bump()
        return copy.deepcopy(stored)

    def kept(self) -> KeptCertificate:
        return KeptCertificate.from_secret_data(self.objects[PATH]["data"])

    def writes(self) -> list[str]:
        return [call for call in self.calls if not call.startswith("GET")]


def run(client: FakeSecrets, names: list[str] = NAMES, now: datetime.datetime = T0) -> tuple[TlsFiles, KeptCertificate]:
    return asyncio.run(kept_in_secret(client, NS, NAME, names, now=now))


def served_names(kept: KeptCertificate) -> set[str]:
    leaf = x509.load_pem_x509_certificate(kept.cert_pem)
    return set(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
               .get_values_for_type(x509.DNSName))


def test_the_first_start_makes_a_ca_and_a_certificate_and_stores_them() -> None:
    client = FakeSecrets()
    files, kept = run(client)
    secret = client.objects[PATH]
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert client.kept() == kept
    assert Path(files.cert_file).read_bytes() == kept.cert_pem and Path(files.key_file).read_bytes() == kept.key_pem
    assert Path(files.key_file).stat().st_mode & 0o077 == 0
    assert not files.self_signed
    assert set(NAMES) <= served_names(kept)
    ca = x509.load_pem_x509_certificate(kept.ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    x509.load_pem_x509_certificate(kept.cert_pem).verify_directly_issued_by(ca)


def test_a_restart_reuses_the_kept_certificate_without_writing() -> None:
    client = FakeSecrets()
    _, first = run(client)
    client.calls.clear()
    files, again = run(client, now=T0 + datetime.timedelta(days=300))
    assert again == first and Path(files.cert_file).read_bytes() == first.cert_pem
    assert client.writes() == []


def test_renewed_with_the_same_ca_within_30_days_of_its_end() -> None:
    client = FakeSecrets()
    _, first = run(client)
    _, renewed = run(client, now=T0 + datetime.timedelta(days=340))  # 25 days left of a 365-day leaf
    assert renewed.cert_pem != first.cert_pem and renewed.ca_pem == first.ca_pem
    assert client.kept() == renewed
    leaf = x509.load_pem_x509_certificate(renewed.cert_pem)
    assert leaf.not_valid_after_utc > T0 + datetime.timedelta(days=700)


def test_renewed_with_the_same_ca_when_a_name_is_missing() -> None:
    client = FakeSecrets()
    _, first = run(client, names=NAMES[:1])
    _, renewed = run(client)
    assert renewed.ca_pem == first.ca_pem and set(NAMES) <= served_names(renewed)


def test_a_new_ca_when_the_old_one_is_near_its_end() -> None:
    client = FakeSecrets()
    _, first = run(client)
    _, renewed = run(client, now=T0 + CA_LIFETIME - datetime.timedelta(days=10))
    assert renewed.ca_pem != first.ca_pem
    x509.load_pem_x509_certificate(renewed.cert_pem).verify_directly_issued_by(
        x509.load_pem_x509_certificate(renewed.ca_pem))


def test_a_leaf_not_signed_by_the_kept_ca_is_replaced() -> None:
    client = FakeSecrets()
    _, first = run(client)
    other_ca, other_key = make_ca(T0)
    cert_pem, key_pem = make_leaf(other_ca, other_key, NAMES, T0)
    data = client.objects[PATH]["data"]
    data["tls.crt"], data["tls.key"] = base64.b64encode(cert_pem).decode(), base64.b64encode(key_pem).decode()
    _, replaced = run(client)
    assert replaced.ca_pem == first.ca_pem and replaced.cert_pem not in (first.cert_pem, cert_pem)


@pytest.mark.parametrize("damage", ["drop tls.key", "not base64", "key of another"])
def test_a_damaged_secret_is_replaced(damage: str) -> None:
    client = FakeSecrets()
    _, first = run(client)
    data = client.objects[PATH]["data"]
    if damage == "drop tls.key":
        del data["tls.key"]
    elif damage == "not base64":
        data["tls.crt"] = "%%%"
    else:
        data["tls.key"] = base64.b64encode(make_ca(T0)[1]).decode()
    _, replaced = run(client)
    assert replaced.cert_pem != first.cert_pem and client.kept() == replaced


def test_a_secret_of_another_type_is_named_and_left_alone() -> None:
    client = FakeSecrets()
    client.objects[PATH] = {"type": "Opaque", "metadata": {"name": NAME, "resourceVersion": "1"}, "data": {}}
    with pytest.raises(TlsError, match=rf"Secret {NS}/{NAME} is of type 'Opaque'.*--api-tls-secret"):
        run(client)
    assert client.writes() == []


def test_two_replicas_creating_at_once_serve_the_winners_certificate() -> None:
    client = FakeSecrets()
    winner = FakeSecrets()
    _, theirs = run(winner)
    client.before_write.append(lambda: client.objects.update(copy.deepcopy(winner.objects)))
    _, ours = run(client)
    assert ours == theirs


def test_a_patch_that_lost_a_race_reads_again() -> None:
    client = FakeSecrets()
    run(client)
    later = T0 + datetime.timedelta(days=340)
    other = FakeSecrets()
    other.objects, other.version = copy.deepcopy(client.objects), 100  # its own, later resourceVersions
    _, theirs = run(other, now=later)  # the other replica renewed first
    client.before_write.append(lambda: client.objects.update(copy.deepcopy(other.objects)))
    client.calls.clear()
    _, ours = run(client, now=later)
    assert ours == theirs
    assert client.writes() == [f"PATCH {PATH}"]  # refused (Conflict); the second read found it renewed


def test_the_served_certificate_verifies_with_ca_crt_for_the_service_name(tmp_path: Path) -> None:
    client = FakeSecrets()
    files, _ = run(client, now=datetime.datetime.now(datetime.UTC))
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(files.cert_file, files.key_file)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        connection, _ = listener.accept()
        # the refused handshake below ends in an error on this side too
        with contextlib.suppress(OSError), server_context.wrap_socket(connection, server_side=True) as tls:
            tls.recv(1)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(base64.b64decode(client.objects[PATH]["data"]["ca.crt"]))
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            context.wrap_socket(raw, server_hostname="gpuwm-controller.gpuwm.svc") as tls:
        assert (tls.getpeercert() or {})["subjectAltName"]
        tls.send(b"x")
    thread.join(5)
    listener.close()
    # and a name the certificate does not carry is refused
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as raw, pytest.raises(ssl.SSLCertVerificationError):
        context.wrap_socket(raw, server_hostname="evil.example")
    thread.join(5)
    listener.close()


def test_the_setting_names_the_secret_and_its_names() -> None:
    settings = Settings(api_tls_secret="x-tls", api_tls_dns_names="a.b.svc, a")
    assert settings.api_tls_secret == "x-tls" and settings.api_tls_dns_names == ["a.b.svc", "a"]
    assert Settings().api_tls_secret == "" and Settings().api_tls_dns_names == []


class Refusing(FakeSecrets):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        raise ApiError(403, f'secrets "{NAME}" is forbidden')


def test_the_controller_serves_a_certificate_in_memory_when_the_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from gpuwm.controller import handlers

    class Runtime:
        settings = Settings(api_tls_secret=NAME, api_tls_dns_names=NAMES)
        client: FakeSecrets = Refusing()

    monkeypatch.setenv("POD_NAMESPACE", NS)
    with caplog.at_level(logging.WARNING):
        files = asyncio.run(handlers._kept_certificate(Runtime(), "127.0.0.1"))  # type: ignore[arg-type]
    assert files.self_signed
    assert f"cannot keep the certificate in Secret {NS}/{NAME}" in caplog.text and "403" in caplog.text

    client = FakeSecrets()
    Runtime.client = client
    files = asyncio.run(handlers._kept_certificate(Runtime(), "127.0.0.1"))  # type: ignore[arg-type]
    assert not files.self_signed and Path(files.cert_file).read_bytes() == client.kept().cert_pem
