"""A real Kubernetes control plane for tests, found and run the way controller-runtime's envtest does.

`KUBEBUILDER_ASSETS` names a folder with `kube-apiserver` and `kubectl` (and `kube-controller-manager`,
which this tier needs for ServiceAccounts, Jobs and garbage collection); etcd comes from `ETCD_BIN`, the
assets folder, or PATH. The binaries run on 127.0.0.1 with free ports and their own state folder, with
certificates made here (`cryptography`), and are stopped at the end; nothing outside the state folder
is written. `.ci/run` provides the assets from ../shared/envtest (Kubernetes v1.36.2, Debian's etcd).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.integration.kubeemu import KubeHttp

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
# the kube-controller-manager controllers the tier relies on (as ../shared/envtest/control-plane.sh starts):
# node lifecycle and pod GC stay off so that fake Nodes and their pods are not evicted
KCM_CONTROLLERS = ",".join([
    "serviceaccount-controller", "serviceaccount-token-controller", "job-controller", "garbage-collector-controller",
    "namespace-controller", "root-ca-certificate-publisher-controller", "clusterrole-aggregation-controller",
])


@dataclass(frozen=True)
class Assets:
    kube_apiserver: Path
    kubectl: Path
    etcd: Path
    kube_controller_manager: Path | None


def find_assets(environ: dict[str, str] | None = None) -> Assets | str:
    """The binaries, or the reason they cannot be used (a sentence for a skip or a CI failure)."""
    env = os.environ if environ is None else environ
    folder = env.get("KUBEBUILDER_ASSETS", "")
    if not folder:
        return ("KUBEBUILDER_ASSETS is not set (a folder with kube-apiserver, kubectl, kube-controller-manager; "
                "`../shared/envtest/control-plane.sh env` prints one, `setup-envtest use 1.36 -p path` another)")
    assets = Path(folder)
    missing = [name for name in ("kube-apiserver", "kubectl", "kube-controller-manager")
               if not os.access(assets / name, os.X_OK)]
    if missing:
        return f"KUBEBUILDER_ASSETS={folder} has no executable {', '.join(missing)}"
    etcd_given = env.get("ETCD_BIN", "")
    etcd = (Path(etcd_given) if etcd_given else
            assets / "etcd" if os.access(assets / "etcd", os.X_OK) else
            Path(found) if (found := shutil.which("etcd")) else None)
    if etcd is None or not os.access(etcd, os.X_OK):
        return (f"no etcd: ETCD_BIN={etcd_given!r} is not executable" if etcd_given else
                "no etcd in KUBEBUILDER_ASSETS, ETCD_BIN or PATH (Debian: apt-get install etcd-server)")
    return Assets(assets / "kube-apiserver", assets / "kubectl", etcd, assets / "kube-controller-manager")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_pki(directory: Path) -> None:
    """ca, apiserver (serving 127.0.0.1 and the `kubernetes` Service's names), admin (system:masters),
    kube-controller-manager client certificates, and the ServiceAccount signing key pair sa.key/sa.pub."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = (x509.CertificateBuilder().subject_name(_name("envtest-ca")).issuer_name(_name("envtest-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / "ca.key", ca_key)

    def issue(name: str, subject: x509.Name, server: bool) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                             x509.IPAddress(ipaddress.ip_address(SERVICE_IP)), x509.DNSName("localhost")]
            names += [x509.DNSName(dns) for dns in ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                                     "kubernetes.default.svc.cluster.local")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        (directory / f"{name}.crt").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        _write_key(directory / f"{name}.key", key)

    issue("apiserver", _name("kube-apiserver"), server=True)
    issue("admin", _name("kubernetes-admin", "system:masters"), server=False)
    issue("kube-controller-manager", _name("system:kube-controller-manager"), server=False)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, in `state` (a fresh folder)."""

    def __init__(self, assets: Assets, state: Path) -> None:
        self.assets = assets
        self.state = state
        self.pki = state / "pki"
        self.api_port = free_port()
        self.url = f"https://127.0.0.1:{self.api_port}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.admin_kubeconfig = state / "admin.kubeconfig"

    # ------------------------------------------------------------------ clients
    def admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def admin(self) -> KubeHttp:
        """The test's own calls, as cluster-admin (client certificate in system:masters)."""
        return KubeHttp(self.url, self.admin_context())

    def as_token(self, token: str | None) -> KubeHttp:
        """Calls with a bearer token (or none: anonymous), trusting the server's CA."""
        return KubeHttp(self.url, ssl.create_default_context(cafile=str(self.pki / "ca.crt")), token)

    def write_kubeconfig(self, path: Path, *, token: str | None = None, certificate: str = "admin",
                         namespace: str = "default") -> Path:
        """A kubeconfig with the CA embedded and either a bearer token or a client certificate of the PKI."""
        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()
        user: dict[str, Any] = ({"token": token} if token is not None else
                                {"client-certificate-data": b64(f"{certificate}.crt"),
                                 "client-key-data": b64(f"{certificate}.key")})
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "envtest",
            "clusters": [{"name": "envtest", "cluster": {"server": self.url, "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "envtest-user", "user": user}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest-user",
                                                         "namespace": namespace}}],
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def kubectl(self, *arguments: str, stdin: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.assets.kubectl), "--kubeconfig", str(self.admin_kubeconfig), *arguments],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(arguments)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def token(self, namespace: str, service_account: str, seconds: int = 3600,
              audiences: list[str] | None = None) -> str:
        """A ServiceAccount token from the TokenRequest API (what a projected volume gives a pod); for the API
        server's own audience unless `audiences` are named."""
        spec: dict[str, Any] = {"expirationSeconds": seconds, **({"audiences": audiences} if audiences else {})}
        answer = self.admin().create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                                     {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(answer["status"]["token"])

    # ------------------------------------------------------------------ lifecycle
    def log(self, name: str) -> Path:
        return self.state / f"{name}.log"

    def _launch(self, name: str, arguments: list[str]) -> None:
        with self.log(name).open("ab") as handle:
            self.processes[name] = subprocess.Popen(arguments, stdout=handle, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, cwd=self.state, start_new_session=True)

    def _wait(self, name: str, what: str, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited ({self.processes[name].returncode}) while waiting for {what}:\n"
                                   f"{self.log(name).read_text()[-3000:]}")
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log(name).read_text()[-3000:]}")

    def start(self, timeout: float = 180.0) -> ControlPlane:
        self.state.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        self.write_kubeconfig(self.admin_kubeconfig)
        kcm_kubeconfig = self.write_kubeconfig(self.state / "kcm.kubeconfig", certificate="kube-controller-manager")
        etcd_port, etcd_peer_port, kcm_port = free_port(), free_port(), free_port()
        try:
            self._launch("etcd", [
                str(self.assets.etcd), "--name", "envtest", "--data-dir", str(self.state / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer_port}",
                "--initial-cluster", f"envtest=http://127.0.0.1:{etcd_peer_port}", "--initial-cluster-state", "new",
                "--unsafe-no-fsync",  # test data: an fsync per write only slows the shared CI disk
            ])
            self._wait("etcd", "etcd /health", lambda: b'"health":"true"' in _http_get(
                f"http://127.0.0.1:{etcd_port}/health", None), 60)
            pki = self.pki
            self._launch("kube-apiserver", [
                str(self.assets.kube_apiserver), "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}", f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true", f"--cert-dir={self.state / 'apiserver-certs'}", "--profiling=false", "--v=1",
            ])
            context = self.admin_context()
            self._wait("kube-apiserver", "kube-apiserver /readyz",
                       lambda: _http_get(f"{self.url}/readyz", context) == b"ok", timeout)
            assert self.assets.kube_controller_manager is not None
            self._launch("kube-controller-manager", [
                str(self.assets.kube_controller_manager), f"--kubeconfig={kcm_kubeconfig}",
                f"--authentication-kubeconfig={kcm_kubeconfig}", f"--authorization-kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", f"--cert-dir={self.state / 'kcm-certs'}",
                "--leader-elect=false", f"--controllers={KCM_CONTROLLERS}", "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false", "--v=1",
            ])
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate; only /healthz is read
            self._wait("kube-controller-manager", "kube-controller-manager /healthz",
                       lambda: _http_get(f"https://127.0.0.1:{kcm_port}/healthz", insecure) == b"ok", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop what was started, newest first: SIGTERM, then SIGKILL after 20 s."""
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        self.processes.clear()


def _http_get(url: str, context: ssl.SSLContext | None) -> bytes:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as response:
            return bytes(response.read())
    except urllib.error.HTTPError:
        return b""
