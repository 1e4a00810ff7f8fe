# trainyard: the control plane's image (watcher, planner, applier, status, devcluster, up).
#
#   docker build -t trainyard:dev .                     # base python:3.11-slim
#   make image                                          # here: buildah, no daemon, local Debian base
#
# The base is a build argument so the same file builds on python:3.11-slim (users) and on a local
# Debian bookworm + python3 image made with mmdebstrap (`make image`, no registry needed).
# The final stage holds the virtual environment only: no compiler, no pip, a numeric non-root
# user, and nothing written at run time outside /tmp (read-only root filesystem friendly).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# Package index settings for the build only (a mirror, a proxy's CA); none reach the final stage.
ARG PIP_INDEX_URL
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in LICENSE README.md constraints.txt ./
COPY libs libs
COPY services services
COPY deploy deploy
COPY examples examples
# One venv at a fixed path; the pinned versions of constraints.txt. kubernetes-validate ships the
# JSON schemas of every Kubernetes release (about 100 MB); trainyard reads only v1.36.0's.
RUN python3 -m venv /opt/trainyard \
 && /opt/trainyard/bin/pip install --quiet -c constraints.txt . \
 && schemas=$(/opt/trainyard/bin/python -c "import kubernetes_validate, os; print(os.path.join(os.path.dirname(kubernetes_validate.__file__), 'kubernetes-json-schema'))") \
 && find "$schemas" -mindepth 1 -maxdepth 1 ! -name 'v1.36.0-local' -exec rm -rf {} + \
 && /opt/trainyard/bin/pip uninstall --quiet -y pip setuptools wheel \
 && find /opt/trainyard -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/trainyard/bin/python -m compileall -q -j 0 /opt/trainyard/lib \
 && /opt/trainyard/bin/trainyard --version

FROM ${BASE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="trainyard" \
      org.opencontainers.image.description="Kubeflow Trainer v2 compatible control plane on NATS JetStream" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/trainyard/trainyard"
COPY --from=build /opt/trainyard /opt/trainyard
ENV PATH=/opt/trainyard/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TRAINYARD_HTTP_HOST=0.0.0.0
# The mount point of docker-compose.yml's `bus` volume: a new named volume takes this directory's
# owner, so the credentials job (uid 10001) can write the bus's CA, certificate and identities.
RUN mkdir -p /etc/trainyard/bus && chown 10001:10001 /etc/trainyard/bus && chmod 0700 /etc/trainyard/bus
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9443
ENTRYPOINT ["trainyard"]
CMD ["--help"]
