#!/usr/bin/env python3
"""Copy the CRDs in crds/ (the source of truth) into the Helm chart's crds/.

    python scripts/sync-crds.py           # copy
    python scripts/sync-crds.py --check   # exit 1 and name the files that differ

Only gpuwm's own CRDs (crds/gpuwm.io_*.yaml) are managed; the chart's other CRDs (kopf's
peering CRDs) are left alone. A chart CRD whose source is gone is removed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "crds"
TARGET = ROOT / "charts" / "gpuwm" / "crds"
PATTERN = "gpuwm.io_*.yaml"


def differences(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """What `sync` would change, one line per file; empty when the chart is in step."""
    problems = []
    wanted = {path.name: path for path in sorted(source.glob(PATTERN))}
    present = {path.name: path for path in sorted(target.glob(PATTERN))}
    for name, path in wanted.items():
        if name not in present:
            problems.append(f"{target / name}: missing (copy of {path})")
        elif present[name].read_bytes() != path.read_bytes():
            problems.append(f"{target / name}: differs from {path}")
    for name in sorted(set(present) - set(wanted)):
        problems.append(f"{target / name}: has no source in {source}")
    return problems


def sync(source: Path = SOURCE, target: Path = TARGET) -> None:
    target.mkdir(parents=True, exist_ok=True)
    wanted = {path.name for path in source.glob(PATTERN)}
    for path in sorted(source.glob(PATTERN)):
        shutil.copyfile(path, target / path.name)
    for path in target.glob(PATTERN):
        if path.name not in wanted:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences instead of copying")
    arguments = parser.parse_args(argv)
    if arguments.check:
        problems = differences()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run: python scripts/sync-crds.py", file=sys.stderr)
        return 1 if problems else 0
    sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
