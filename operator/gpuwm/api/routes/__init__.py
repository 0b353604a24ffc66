"""The metrics API's routes, one router per resource, in the order the OpenAPI document lists them."""

from __future__ import annotations

from gpuwm.api.routes import fleet, operations, projects, reports, workloads

ROUTERS = (
    workloads.router, projects.router, fleet.router, reports.router, workloads.queue_router, operations.router,
)

__all__ = ["ROUTERS"]
