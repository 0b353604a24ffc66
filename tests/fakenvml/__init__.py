"""Build the fake libnvidia-ml.so.1 (fakenvml.c) with `cc` and run processes against it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")


def build_fake_nvml(directory: Path, minimal: bool = False) -> Path:
    """Compile the fake into `directory/libnvidia-ml.so.1`; returns the directory for LD_LIBRARY_PATH.

    `minimal` leaves out every optional NVML function (see fakenvml.c).
    """
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) found; install build-essential to build the fake NVML library")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "libnvidia-ml.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", *(["-DFAKENVML_MINIMAL"] if minimal else []), "-o", str(target),
         str(SOURCE)],
        check=True, capture_output=True, text=True,
    )
    return directory


def fake_nvml_env(library_dir: Path | None, scenario: Path | None) -> dict[str, str]:
    """The environment of a process that should load the fake (or, with None, no NVML at all)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO", "NODE_NAME")}
    env = {k: v for k, v in env.items() if not k.startswith("GPUWM_")}
    if library_dir is not None:
        env["LD_LIBRARY_PATH"] = str(library_dir)
    if scenario is not None:
        env["FAKE_NVML_SCENARIO"] = str(scenario)
    return env


def write_scenario(path: Path, text: str) -> Path:
    """Write a scenario so the fake sees a new modification time (it reloads on change)."""
    previous = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == previous:  # coarse filesystem clocks
        os.utime(path, ns=(previous + 1_000_000, previous + 1_000_000))
    return path
