"""How the tier finds its binaries (envtest's conventions), checked without starting them."""

from __future__ import annotations

from pathlib import Path

from tests.envtest.controlplane import Assets, find_assets


def _folder(tmp_path: Path, *names: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    return tmp_path


def test_no_kubebuilder_assets_says_what_to_set() -> None:
    reason = find_assets({})
    assert isinstance(reason, str) and "KUBEBUILDER_ASSETS is not set" in reason


def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "kube-apiserver", "kubectl")
    reason = find_assets({"KUBEBUILDER_ASSETS": str(folder), "ETCD_BIN": str(folder / "kubectl")})
    assert reason == f"KUBEBUILDER_ASSETS={folder} has no executable kube-controller-manager"


def test_etcd_from_etcd_bin_then_the_assets_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "assets", "kube-apiserver", "kubectl", "kube-controller-manager", "etcd")
    found = find_assets({"KUBEBUILDER_ASSETS": str(folder)})
    assert isinstance(found, Assets) and found.etcd == folder / "etcd"
    other = _folder(tmp_path / "bin", "etcd")
    found = find_assets({"KUBEBUILDER_ASSETS": str(folder), "ETCD_BIN": str(other / "etcd")})
    assert isinstance(found, Assets) and found.etcd == other / "etcd"
    reason = find_assets({"KUBEBUILDER_ASSETS": str(folder), "ETCD_BIN": str(tmp_path / "nowhere")})
    assert isinstance(reason, str) and "ETCD_BIN" in reason
