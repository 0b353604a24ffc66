"""Regenerate api_pb2.py / api_pb2_grpc.py from api.proto (needs grpcio-tools, the `test` extra)."""

from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc


def main() -> int:
    here = pathlib.Path(__file__).resolve().parent
    status = protoc.main(["grpc_tools.protoc", f"-I{here}", f"--python_out={here}", f"--pyi_out={here}", f"--grpc_python_out={here}", str(here / "api.proto")])
    if status != 0:
        return int(status)
    grpc_module = here / "api_pb2_grpc.py"
    # protoc writes a top-level `import api_pb2`; make it package-relative
    text = re.sub(r"^import api_pb2 as", "from gpuwm.agent.proto import api_pb2 as", grpc_module.read_text(), flags=re.M)
    grpc_module.write_text(text)
    stubs = here / "api_pb2.pyi"  # generated style; keep linters on our own code
    stubs.write_text("# ruff: noqa\n" + stubs.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
