#!/usr/bin/env bash
# gpuwm end-to-end in one command: tests/e2e/test_e2e.py on a real cluster built from this checkout.
#
#   bash tests/e2e/run.sh                          # the node of ../shared/envtest/node.sh if it runs, else kind
#   GPUWM_E2E_CLUSTER=kind bash tests/e2e/run.sh   # kind: needs docker, kind and kubectl
#   KEEP_CLUSTER=1 GPUWM_E2E_CLUSTER=kind bash tests/e2e/run.sh   # leave the kind cluster up to look around
#
# The node path needs the node started first (`node.sh setup`, `node.sh start`; .ci/run does both).
# Helm's library runs from .venv-helm (Python 3.12; made on first use). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PYTHON" ]] || { echo "no $PYTHON: python3 -m venv .venv && .venv/bin/pip install -e '.[test]'" >&2; exit 1; }
cd "$ROOT"
exec "$PYTHON" -m pytest tests/e2e -p no:cacheprovider -rs -s "$@"
