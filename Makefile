# trainyard: the two commands of the quick start are `make demo` and `make test`.
# Each builds .venv from scratch when needed and reuses it while the lock is unchanged.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-lock
LOCK_INPUTS := constraints.txt pyproject.toml setup.py
TORCH_VERSION := 2.13.0
UV_VERSION := 0.13.9
UV_PIP = $(BIN)/uv pip install --quiet --python $(BIN)/python
# make test runs the suite in this many pytest processes (pytest-xdist; tests/conftest.py keeps
# each module, the data plane modules and the torch trainings together). Most tests wait on
# processes they started, so two processes use a 2-core machine about twice as well as one
# (1244 s -> 738 s at 2,280 tests). Three are not measurably faster: clean clones on 2 cores,
# pytest's figures, 2 processes 864, 967, 1,133 and 905 s, 3 processes 790, 927 and 1,033 s.
TEST_PROCESSES ?= 2
# The suite and the demo start hundreds of processes (devclusters, services, the CLI) that import
# the project from its source tree. Where the environment sets PYTHONDONTWRITEBYTECODE, each of
# them would compile every module it imports again, about 0.25 s of CPU a process: here Python
# keeps its bytecode cache as it does by default (__pycache__ is ignored by git).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: venv test test-loaded test-fast demo crds lint-imports bench clean system-tools

# The stamp holds a hash of the lock inputs: a changed lock rebuilds the venv's packages.
# Packages are installed by uv (pinned below, itself installed by the venv's pip): the same
# versions as pip resolves from constraints.txt, in about 10 s where pip took 95 s on a fresh
# 2-core machine (it fetches in parallel and does not byte-compile all of torch up front; Python
# compiles what is imported, once, into __pycache__). uv does not read pip's configuration, so
# pip's find-links (where a machine keeps its local wheels, such as the CPU build of torch) are
# handed to it.
$(STAMP): $(LOCK_INPUTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	@links="$$($(BIN)/python -m pip config get global.find-links 2>/dev/null || true)"; \
	  links="$${PIP_FIND_LINKS:-$$links}"; \
	  set -x; \
	  $(UV_PIP) $${links:+--find-links "$$links"} "pip>=24" "torch==$(TORCH_VERSION)" && \
	  $(UV_PIP) $${links:+--find-links "$$links"} -c constraints.txt -e ".[dev]"
	@cat $(LOCK_INPUTS) | sha256sum > $(STAMP)

venv: $(STAMP)

# Prometheus and Chromium (Debian packages) for the observability tests: installed only when
# missing and when running as root with apt; elsewhere those tests skip and say why.
SYSTEM_TOOLS := prometheus:prometheus chromium:chromium
system-tools:
	@for pair in $(SYSTEM_TOOLS); do pkg=$${pair%%:*}; bin=$${pair##*:}; \
	  if command -v $$bin >/dev/null 2>&1; then continue; fi; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1)) \
	      && echo "installed $$pkg" || echo "could not install $$pkg (tests that need it skip)"; \
	  else echo "$$pkg missing and not root with apt: tests that need it skip"; fi; \
	done

test: venv system-tools
	$(BIN)/lint-imports --config .importlinter
	$(BIN)/python bench/structure.py --check
	$(BIN)/python -m pytest -q -rs --durations=20 -n $(TEST_PROCESSES) tests

# The suite with BUSY_CORES (default 1) cores kept busy by a loop, as on a shared machine:
# `make test-loaded`, or `make test-loaded TEST_PROCESSES=4`.
test-loaded:
	BUSY_CORES=$(or $(BUSY_CORES),1) bash .ci/loaded TEST_PROCESSES=$(TEST_PROCESSES)

test-fast: venv
	$(BIN)/python -m pytest -q -x -m "not torch and not slow" tests

crds: venv
	$(BIN)/trainyard crds --out deploy/crds

lint-imports: venv
	$(BIN)/lint-imports --config .importlinter

demo: venv
	$(BIN)/python -m trainyard.cli.demo

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# ---- container image, without a Docker daemon (docs/deploy.md) -----------------------------
# `make image` builds Dockerfile with Debian's buildah (vfs storage, chroot isolation: no daemon,
# no overlay mounts, no runc needed) on a local bookworm + python3 base made with mmdebstrap from
# Debian's packages, so no container registry is needed. Users with Docker: `docker build .`
# (base python:3.11-slim). `make image-tools` installs the Debian packages (root, apt): runc
# because crun cannot run containers in this VM's hybrid cgroup layout (docs/deploy.md), and the
# CNI dnsname plugin so that compose services find each other by name.
IMAGE        ?= localhost/trainyard:dev
IMAGE_BASE   ?= localhost/trainyard-base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
CONTAINERS_STORAGE := --storage-driver vfs
IMAGE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE_TAR     := build/image/base-bookworm.tar

.PHONY: image image-tools image-base test-image compose-config

image-tools:
	@missing=""; for tool in buildah:buildah podman:podman runc:runc mmdebstrap:mmdebstrap podman-compose:podman-compose \
	    uidmap:newuidmap golang-github-containernetworking-plugin-dnsname:/usr/lib/cni/dnsname; do \
	  command -v $${tool##*:} >/dev/null 2>&1 || missing="$$missing $${tool%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (Debian packages)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null \
	    || (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null); \
	fi

# Debian bookworm (minbase) with python3 and venv, no docs or man pages: the local stand-in for
# python:3.11-slim (bookworm's python3 is 3.11). The merged-usr hook lays out /usr as bookworm
# wants without the usrmerge package, which would pull in perl (about 50 MB).
$(BASE_TAR):
	@mkdir -p $(dir $@)
	mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates \
	  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
	  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	  --customize-hook='rm -rf "$$1"/var/cache/apt/* "$$1"/var/lib/apt/lists/*' \
	  bookworm $@.tmp $(DEBIAN_MIRROR) && mv $@.tmp $@

image-base: image-tools $(BASE_TAR)
	@buildah $(CONTAINERS_STORAGE) inspect --type image $(IMAGE_BASE) >/dev/null 2>&1 || { \
	  ctr=$$(buildah $(CONTAINERS_STORAGE) from scratch) && \
	  buildah $(CONTAINERS_STORAGE) add $$ctr $(BASE_TAR) / && \
	  buildah $(CONTAINERS_STORAGE) config --env LANG=C.UTF-8 --cmd python3 $$ctr && \
	  buildah $(CONTAINERS_STORAGE) commit --quiet --rm $$ctr $(IMAGE_BASE); }

# PIP_CERT: the host's CA bundle, for networks whose HTTPS goes through a proxy with its own CA.
HOST_CA := /etc/ssl/certs/ca-certificates.crt
image: image-base
	buildah $(CONTAINERS_STORAGE) build --isolation chroot --network host --layers=false \
	  $$(test -f $(HOST_CA) && echo --volume $(HOST_CA):/etc/ssl/host-ca.crt:ro --build-arg PIP_CERT=/etc/ssl/host-ca.crt) \
	  --build-arg BASE=$(IMAGE_BASE) --build-arg VERSION=$(IMAGE_VERSION) \
	  --build-arg REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) \
	  -f Dockerfile -t $(IMAGE) .
	@buildah $(CONTAINERS_STORAGE) images --format '{{.Name}}:{{.Tag}} {{.Size}}' $(IMAGE)

# The image test (builds the image, runs the services from it against a devcluster on the host).
test-image: venv image
	TRAINYARD_TEST_IMAGE=$(IMAGE) $(BIN)/python -m pytest -q -rs -m image tests/image

# podman-compose >= 1.1 has `config`; Debian bookworm's 1.0.3 has not, and its `--dry-run up`
# still creates volumes and networks, so there the check is `--dry-run ps` (parses and resolves the
# whole file, runs nothing).
compose-config: image-tools
	@if podman-compose -f docker-compose.yml config >/dev/null 2>&1; then :; \
	else STORAGE_DRIVER=vfs podman-compose --dry-run -f docker-compose.yml ps >/dev/null; fi \
	  && echo "docker-compose.yml: valid"
