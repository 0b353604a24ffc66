"""HTTPS by default: `gpuwm api` and the controller serve TLS unless --api-tls=false; a certificate
from files, else a self-signed one made at start; bad TLS options exit 2 naming them."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.server import ApiServer
from gpuwm.api.tls import TlsError, self_signed, tls_files
from gpuwm.cli import main
from gpuwm.config import Settings

from .api_data import populate


def test_tls_is_the_default() -> None:
    assert Settings().api_tls is True
    assert Settings(api_tls="false").api_tls is False


def test_tls_options() -> None:
    assert tls_files(False, "", "", "127.0.0.1") is None
    with pytest.raises(TlsError, match="--api-tls-key-file"):
        tls_files(True, "/x/tls.crt", "", "127.0.0.1")
    with pytest.raises(TlsError, match="no such file"):
        tls_files(True, "/nonexistent/tls.crt", "/nonexistent/tls.key", "127.0.0.1")
    made = tls_files(True, "", "", "127.0.0.1")
    assert made is not None and made.self_signed
    assert Path(made.key_file).stat().st_mode & 0o077 == 0  # the key is private to this user


async def test_served_over_https_with_the_files_given(tmp_path: Path) -> None:
    store = populate(tmp_path / "gpuwm.db")
    certificate = self_signed("127.0.0.1")
    files = tls_files(True, certificate.cert_file, certificate.key_file, "127.0.0.1")
    server = ApiServer(create_app(store, Settings(auth="none")), "127.0.0.1", 0, tls=files)
    await server.start()
    try:
        assert server.scheme == "https"
        context = ssl.create_default_context(cafile=certificate.cert_file)
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.get(f"https://127.0.0.1:{server.port}/api/v1/workloads")
            assert response.status_code == 200 and response.json()["workloads"]
        # plain HTTP to the HTTPS port gets no answer
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(f"http://127.0.0.1:{server.port}/healthz")
    finally:
        await server.stop()
        store.close()


def test_gpuwm_api_serves_https_by_default(tmp_path: Path) -> None:
    populate(tmp_path / "gpuwm.db").close()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwm.cli", "api", "--store", str(tmp_path / "gpuwm.db"), "--auth", "none",
         "--api-listen", "127.0.0.1:0", "--log-level", "info"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        line, seen = "", []
        while "listening on" not in line and time.monotonic() < deadline:
            line = process.stdout.readline()
            seen.append(line)
        assert "listening on https://127.0.0.1:" in line, line
        # the self-signed certificate's warning names the options this verb takes
        warning = next(each for each in seen if "self-signed certificate" in each)
        assert "--api-tls-cert-file" in warning and "--api-tls-secret" not in warning, warning
        port = int(line.rsplit(":", 1)[1].split()[0])
        response = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False)
        assert response.status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_bad_tls_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "gpuwm.db")
    assert main(["api", "--store", store, "--auth", "none", "--api-listen", "127.0.0.1:0",
                 "--api-tls-cert-file", str(tmp_path / "missing.crt")]) == 2
    assert "--api-tls-key-file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["api", "--store", store, "--api-tls=maybe"])
    assert "expected true or false" in capsys.readouterr().err
