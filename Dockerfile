# syntax=docker/dockerfile:1
# One image for every HeteroFlow component; the command picks it (server, agent run, controller, coordinator,
# node-manager). Build: docker build -t heteroflow:0.1.0 .
#
# The base is pinned by the digest of the python:3.12-slim-bookworm multi-architecture index, so a rebuild
# gets the same interpreter and system libraries. Update the digest deliberately, in both stages.

# ---- build: install the package and its dependencies into a virtual environment -------------------------------
FROM python:3.12-slim-bookworm@sha256:34386ef0cb081344d7ec1c103ba398e6e9f64e9ab3a1509accc92a4e24a07258 AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/heteroflow
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/heteroflow/bin/pip install . \
    && /opt/heteroflow/bin/python -m compileall -q /opt/heteroflow/lib

# ---- runtime: the virtual environment and an unprivileged user, nothing else ------------------------------------
FROM python:3.12-slim-bookworm@sha256:34386ef0cb081344d7ec1c103ba398e6e9f64e9ab3a1509accc92a4e24a07258 AS runtime

# Bytecode was compiled at build time; the root filesystem is read-only in the Kubernetes manifests.
ENV PATH=/opt/heteroflow/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/heteroflow

RUN groupadd --system --gid 10001 heteroflow \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/heteroflow --create-home \
       --shell /usr/sbin/nologin heteroflow

COPY --from=build /opt/heteroflow /opt/heteroflow

USER 10001:10001
WORKDIR /home/heteroflow

# server 8080, NodeManager 8300, Coordinator 8400, controller 8500. No HEALTHCHECK: each component has its own
# port and route, and Kubernetes probes (deploy/kubernetes) check them.
EXPOSE 8080 8300 8400 8500
ENTRYPOINT ["heteroflow"]
CMD ["--help"]
