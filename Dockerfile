# syntax=docker/dockerfile:1
# One image for every `gpuwm` verb (controller, agent, api, demo, replay):
#   docker build -t ghcr.io/gpuwm/gpuwm:$(grep '^appVersion' charts/gpuwm/Chart.yaml | cut -d'"' -f2) .
# The tag is the chart's appVersion, which the chart uses when image.tag is empty.
ARG PYTHON_VERSION=3.11

# --- build: install the package and its dependencies into a venv -------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/gpuwm
# Dependencies first, so a source change does not reinstall them. The placeholder package and what
# setuptools built from it (build/, *.egg-info) go in the same step: a build/lib copy of the placeholder
# __init__.py, newer than the real one copied below, would be packed instead of it.
COPY pyproject.toml README.m[d] ./
RUN mkdir -p operator/gpuwm && touch operator/gpuwm/__init__.py \
    && /opt/gpuwm/bin/pip install . \
    && /opt/gpuwm/bin/pip uninstall -y gpuwm \
    && rm -rf operator build
COPY operator ./operator
# pip and setuptools are not needed to run: the runtime venv goes without them.
RUN /opt/gpuwm/bin/pip install --no-deps . \
    && /opt/gpuwm/bin/gpuwm version \
    && /opt/gpuwm/bin/pip uninstall -y pip setuptools wheel

# --- runtime: the venv on a slim base, no compiler, no pip cache, not root --------------------
FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="gpuwm" \
      org.opencontainers.image.description="GPU workload metrics for Kubernetes" \
      org.opencontainers.image.source="https://github.com/gpuwm/gpuwm" \
      org.opencontainers.image.licenses="Apache-2.0"
# MALLOC_ARENA_MAX=1: glibc's documented knob for its per-thread heaps. The controller writes the store
# from a worker thread; with one heap its free pages serve the next cycle instead of a second heap growing
# beside them (less RSS, and fewer pages faulted in again after each cycle's trim: bench/README.md).
ENV PATH=/opt/gpuwm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=1
COPY --from=build /opt/gpuwm /opt/gpuwm
# UID/GID 65532 match the chart's pod securityContext; the agent alone is run as 0 by the chart
# (the kubelet's pod-resources socket belongs to root), with every capability dropped.
RUN groupadd --system --gid 65532 gpuwm \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpuwm \
    && mkdir -p /var/lib/gpuwm && chown 65532:65532 /var/lib/gpuwm
USER 65532:65532
WORKDIR /var/lib/gpuwm
EXPOSE 8080 9400
ENTRYPOINT ["gpuwm"]
CMD ["--help"]
