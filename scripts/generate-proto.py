#!/usr/bin/env python3
"""Regenerate operator/gpuwm/agent/proto/api_pb2.py / api_pb2.pyi from api.proto beside them.

    python scripts/generate-proto.py   # needs grpcio-tools, the `test` extra
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

PROTO_DIR = Path(__file__).resolve().parent.parent / "operator" / "gpuwm" / "agent" / "proto"


def main() -> int:
    status = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={PROTO_DIR}", f"--pyi_out={PROTO_DIR}", str(PROTO_DIR / "api.proto")])
    if status != 0:
        return int(status)
    stubs = PROTO_DIR / "api_pb2.pyi"  # generated style; keep linters on our own code
    stubs.write_text("# ruff: noqa\n" + stubs.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
