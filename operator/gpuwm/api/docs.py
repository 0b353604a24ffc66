"""A self-contained API docs page rendered from the OpenAPI document (no CDN, unlike Swagger UI)."""

from __future__ import annotations

import html
from typing import Any


def docs_page(openapi: dict[str, Any]) -> str:
    """One HTML page listing every path, its parameters and responses; links to /openapi.json."""
    info = openapi.get("info", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gpuwm API</title>",
        "<link rel='stylesheet' href='/static/dashboard.css'></head><body class='docs'>",
        f"<h1>{html.escape(info.get('title', 'API'))} {html.escape(str(info.get('version', '')))}</h1>",
        f"<p>{html.escape(info.get('description', ''))}</p>",
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a> (OpenAPI 3). "
        "Send <code>Authorization: Bearer &lt;kubernetes token&gt;</code> unless the server runs with --auth=none.</p>",
    ]
    for path, operations in sorted(openapi.get("paths", {}).items()):
        for method, operation in operations.items():
            parts.append(f"<section class='op'><h2><code>{method.upper()} {html.escape(path)}</code></h2>")
            parts.append(
                f"<p>{html.escape(operation.get('summary', ''))}. {html.escape(operation.get('description', ''))}</p>"
            )
            parameters = operation.get("parameters", [])
            if parameters:
                parts.append("<table><tr><th>parameter</th><th>in</th><th>description</th></tr>")
                for parameter in parameters:
                    parts.append(
                        f"<tr><td><code>{html.escape(parameter['name'])}</code></td><td>{html.escape(parameter['in'])}</td>"
                        f"<td>{html.escape(parameter.get('description', ''))}</td></tr>"
                    )
                parts.append("</table>")
            codes = ", ".join(sorted(operation.get("responses", {})))
            parts.append(f"<p>Responses: {html.escape(codes)}</p></section>")
    parts.append("</body></html>")
    return "".join(parts)
