"""PID -> pod through /proc/PID/cgroup, cgroup v1 and v2, cgroupfs and systemd drivers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.agent.cgroup import CgroupReader, PodRef, parse_cgroup

UID = "8f3c2a1e-5b6d-4e7f-9a0b-1c2d3e4f5a6b"
CID = "ab" * 32

CASES = {
    "v1 cgroupfs": (
        f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        "1:name=systemd:/\n",
        PodRef(UID, CID),
    ),
    "v1 systemd": (
        "4:devices:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        PodRef(UID, CID),
    ),
    "v2 systemd": (
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
        PodRef(UID, CID),
    ),
    "v2 cgroupfs guaranteed": (f"0::/kubepods/pod{UID}/{CID}\n", PodRef(UID, CID)),
    "v2 pod slice only": (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n", PodRef(UID, None)),
    "host process": ("0::/system.slice/nvidia-persistenced.service\n", None),
    "docker outside kubernetes": (f"0::/system.slice/docker-{CID}.scope\n", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_cgroup_shapes(name: str) -> None:
    text, expected = CASES[name]
    assert parse_cgroup(text) == expected


def _fake_proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_reader_uses_the_configured_proc_root_and_caches(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 4242, CASES["v2 systemd"][0])
    _fake_proc(tmp_path, 7, CASES["host process"][0])
    reader = CgroupReader(str(tmp_path))
    assert reader.pod_of(4242) == PodRef(UID, CID)
    assert reader.pod_of(7) is None
    assert reader.pod_of(999) is None  # no such process

    # cached: the answer holds while the PID stays on the GPU, even if /proc changes under it
    (tmp_path / "4242" / "cgroup").write_text(CASES["host process"][0])
    assert reader.pod_of(4242) == PodRef(UID, CID)
    reader.retain({7})  # 4242 left the GPU; a new process may reuse the PID
    assert reader.pod_of(4242) is None
