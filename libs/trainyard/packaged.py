"""Where the files shipped beside the code live: `deploy/` (CRDs, runtimes, manifests) and
`examples/`.

In a checkout (editable install, tests) they are the repository's own folders; a built wheel
carries copies under ``trainyard/_data/`` (setup.py's build step puts them there), so a
non-editable `pip install` finds them without the repository. ``TRAINYARD_DEPLOY_DIR`` overrides
the deploy folder (for a customised set of runtimes).
"""
from __future__ import annotations

import os
from pathlib import Path

DEPLOY_DIR_ENV = "TRAINYARD_DEPLOY_DIR"
_PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_DATA_DIR = _PACKAGE_DIR / "_data"


def checkout_dir() -> Path | None:
    """The repository this package is imported from, or None for an installed wheel."""
    root = _PACKAGE_DIR.parents[1]
    if (root / "setup.py").is_file() and (root / "deploy" / "runtimes" / "kustomization.yaml").is_file():
        return root
    return None


def _data_dir(name: str) -> Path:
    root = checkout_dir()
    if root is not None:
        return root / name
    return PACKAGED_DATA_DIR / name


def deploy_dir() -> Path:
    """deploy/: the checkout's, else the copy inside the installed package."""
    override = os.environ.get(DEPLOY_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    return _data_dir("deploy")


def examples_dir() -> Path:
    """examples/: the checkout's, else the copy inside the installed package."""
    return _data_dir("examples")


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("trainyard")
    except metadata.PackageNotFoundError:
        from trainyard import __version__

        return __version__
