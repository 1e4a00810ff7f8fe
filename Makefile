# trainyard: the two commands of the quick start are `make demo` and `make test`.
# Each builds .venv from scratch when needed and reuses it while the lock is unchanged.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-lock
LOCK_INPUTS := constraints.txt pyproject.toml setup.py
TORCH_VERSION := 2.13.0

.PHONY: venv test test-fast demo crds lint-imports bench clean system-tools

# The stamp holds a hash of the lock inputs: a changed lock rebuilds the venv's packages.
$(STAMP): $(LOCK_INPUTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24" 2>/dev/null || true
	# torch first, from the local CPU build, so nothing later pulls another torch.
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
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
	$(BIN)/python -m pytest -q -rs tests

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
