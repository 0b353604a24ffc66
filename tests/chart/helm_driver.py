"""Drive Helm's own library (helm-sdkpy) for the chart tests; runs in the Python >= 3.12 venv.

    helm_driver.py lint CHART [VALUES.yaml ...]
    helm_driver.py install CHART --kubeconfig FILE --namespace NS --release NAME [--wait SECONDS] [VALUES.yaml ...]
    helm_driver.py upgrade CHART --kubeconfig FILE --namespace NS --release NAME [--wait SECONDS] [VALUES.yaml ...]
    helm_driver.py uninstall - --kubeconfig FILE --namespace NS --release NAME [--wait SECONDS]

Prints one JSON object on stdout: {"ok": bool, "result": ..., "error": str}. helm-sdkpy's lint takes
no values files, so values are merged into a copy of the chart's values.yaml, which is what
`helm lint -f VALUES` lints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import helm_sdkpy  # type: ignore[import-not-found]  # only in the Python 3.12 venv
import yaml


def merge(base: Any, overlay: Any) -> Any:
    """Helm's values merge: maps merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base.get(key), value)
        return merged
    return overlay


def load_values(paths: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in paths:
        values = merge(values, yaml.safe_load(Path(path).read_text()) or {})
    return values


def lint(chart: str, values_files: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / Path(chart).name
        shutil.copytree(chart, copy)
        defaults = yaml.safe_load((copy / "values.yaml").read_text()) or {}
        (copy / "values.yaml").write_text(yaml.safe_dump(merge(defaults, load_values(values_files))))
        config = helm_sdkpy.Configuration(namespace="default")
        result: dict[str, Any] = asyncio.run(helm_sdkpy.Lint(config).run(str(copy)))
        return result


def install(chart: str, kubeconfig: str, namespace: str, release: str, values_files: list[str],
            wait_seconds: int = 0) -> dict[str, Any]:
    """`helm install`; with `wait_seconds`, `--wait --timeout` (every Deployment and DaemonSet ready)."""
    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    result: dict[str, Any] = asyncio.run(helm_sdkpy.Install(config).run(
        release, chart, values=load_values(values_files) or None, wait=wait_seconds > 0,
        timeout=wait_seconds or 120))
    return result


def upgrade(chart: str, kubeconfig: str, namespace: str, release: str, values_files: list[str],
            wait_seconds: int = 0) -> dict[str, Any]:
    """`helm upgrade` with these values files alone, as a GitOps tool applies the values it holds."""
    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    result: dict[str, Any] = asyncio.run(helm_sdkpy.Upgrade(config).run(
        release, chart, values=load_values(values_files) or None, wait=wait_seconds > 0,
        timeout=wait_seconds or 120))
    return result


def uninstall(kubeconfig: str, namespace: str, release: str, wait_seconds: int = 0) -> dict[str, Any]:
    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    result: dict[str, Any] = asyncio.run(helm_sdkpy.Uninstall(config).run(
        release, wait=wait_seconds > 0, timeout=wait_seconds or 120))
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["lint", "install", "upgrade", "uninstall"])
    parser.add_argument("chart")
    parser.add_argument("values", nargs="*")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--namespace", default="gpuwm")
    parser.add_argument("--release", default="gpuwm")
    parser.add_argument("--wait", type=int, default=0, metavar="SECONDS")
    arguments = parser.parse_args()
    where = (arguments.kubeconfig, arguments.namespace, arguments.release)
    try:
        if arguments.action == "lint":
            result = lint(arguments.chart, arguments.values)
        elif arguments.action == "install":
            result = install(arguments.chart, *where, arguments.values, arguments.wait)
        elif arguments.action == "upgrade":
            result = upgrade(arguments.chart, *where, arguments.values, arguments.wait)
        else:
            result = uninstall(*where, arguments.wait)
    except helm_sdkpy.HelmError as error:
        print(json.dumps({"ok": False, "error": str(error)}))
        return 0
    print(json.dumps({"ok": True, "result": result}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
