"""Regenerate api_pb2.py / api_pb2.pyi from api.proto (needs grpcio-tools, the `test` extra)."""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc


def main() -> int:
    here = pathlib.Path(__file__).resolve().parent
    status = protoc.main(["grpc_tools.protoc", f"-I{here}", f"--python_out={here}", f"--pyi_out={here}", str(here / "api.proto")])
    if status != 0:
        return int(status)
    stubs = here / "api_pb2.pyi"  # generated style; keep linters on our own code
    stubs.write_text("# ruff: noqa\n" + stubs.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
