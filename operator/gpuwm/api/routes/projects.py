"""Projects: the list and one project's time series (sums over its workloads)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpuwm.api.http import ERRORS, NotFound, check_parameters
from gpuwm.api.routes.context import CallerOf, Context
from gpuwm.api.routes.ranges import SERIES_ROUTE, ScopeRange, answer_scope
from gpuwm.api.schemas import ProjectList

router = APIRouter()


@router.get("/api/v1/projects", response_model=ProjectList, responses=ERRORS, tags=["projects"])
async def list_projects(request: Request, context: Context, caller: CallerOf) -> ProjectList:
    """Current state of every project you may read (all of its namespaces)."""
    check_parameters(request, set())
    user = await caller.authenticate()
    projects = await context.blocking(context.store.projects)
    readable = await caller.readable_namespaces(user, {ns for project in projects for ns in project.namespaces})
    return ProjectList(projects=[project for project in projects if readable.issuperset(project.namespaces)])


@router.get("/api/v1/projects/{project}/metrics", **SERIES_ROUTE)
async def project_metrics(context: Context, caller: CallerOf, project: str, params: ScopeRange) -> Response:
    """Time series of one project (sums over its workloads); it needs access to each of the project's
    namespaces, and one without it is answered as an unknown project; default range: the last hour."""
    user = await caller.authenticate()
    found = await context.blocking(context.store.project, project)
    if found is None or not await caller.may_read(user, found.namespaces):
        raise NotFound(f"no project {project!r} whose namespaces you may all read")
    return await answer_scope(context, params, "project", project)
