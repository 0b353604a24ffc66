"""Fixtures for agent integration tests: the fake NVML library, a pod-resources server, a fake /proc."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fakenvml import build_fake_nvml, fake_nvml_env, write_scenario
from tests.fakenvml.podresources_server import PodResourcesServer
from tests.integration.agent.helpers import (
    ALLOCATABLE,
    PIDS,
    PODS,
    SCENARIO,
    RunningAgent,
    agent_command,
    free_port,
    wait_for,
)


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return write_scenario(tmp_path / "scenario.txt", SCENARIO)


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, uid in PIDS.items():
        (root / str(pid)).mkdir(parents=True)
        path = f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n"
        (root / str(pid) / "cgroup").write_text(path)
    return root


@pytest.fixture
def pod_resources(tmp_path: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(tmp_path / "pr.sock")
    server.pods = list(PODS)
    server.allocatable = dict(ALLOCATABLE)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    started: list[RunningAgent] = []

    def start(lib: Path | None, scenario_path: Path | None, *arguments: str, wait_ready: bool = True) -> RunningAgent:
        port = free_port()
        log_path = tmp_path / f"agent-{port}.log"
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                agent_command("--listen", f"127.0.0.1:{port}", "--node-name", "node-1", *arguments),
                env=fake_nvml_env(lib, scenario_path), stdout=log_file, stderr=subprocess.STDOUT, text=True,
            )
        agent = RunningAgent(process, f"http://127.0.0.1:{port}", log_path)
        started.append(agent)
        wanted = "/readyz" if wait_ready else "/healthz"
        wait_for(lambda: agent.get(wanted)[0] == 200 or process.poll() is not None, what=f"agent {wanted}")
        assert process.poll() is None, agent.log()
        return agent

    yield start
    for agent in started:
        if agent.process.poll() is None:
            agent.process.send_signal(signal.SIGTERM)
            try:
                agent.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(agent.process.pid, signal.SIGKILL)
                agent.process.wait()

