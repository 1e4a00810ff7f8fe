"""Maps the repository layout onto importable packages.

libs/trainyard -> trainyard (all logic), services/ -> trainyard_services (process wiring).
A built wheel also carries deploy/ and examples/ as package data under trainyard/_data/, so a
non-editable install finds its CRDs, runtimes and manifests (trainyard.packaged locates them).
"""
import shutil
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_DIRS = ("deploy", "examples")

# Namespace discovery, as setuptools recommends for data folders: a folder without
# __init__.py (services/dashboard/static) is still an importable package, and leaving it out of
# `packages` makes every build warn that it "is absent from the packages configuration".
_NOT_PACKAGES = ["*__pycache__", "*__pycache__.*"]
library_packages = find_namespace_packages("libs", include=["trainyard", "trainyard.*"], exclude=_NOT_PACKAGES)
service_packages = [
    "trainyard_services" + name[len("services"):]
    for name in find_namespace_packages(".", include=["services", "services.*"], exclude=_NOT_PACKAGES)
]


class BuildWithData(build_py):
    """Copies deploy/ and examples/ into the built package (trainyard/_data/<dir>)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the checkout's folders directly
        for name in SHIPPED_DIRS:
            source = ROOT / name
            if not source.is_dir():
                continue
            target = Path(self.build_lib) / "trainyard" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(
    packages=library_packages + service_packages,
    package_dir={"trainyard": "libs/trainyard", "trainyard_services": "services"},
    include_package_data=True,
    # Data belongs to the package whose folder holds it (the static assets to their own package).
    package_data={"trainyard": ["**/*.yaml", "**/*.json"],
                  "trainyard_services.dashboard.static": ["*"]},
    cmdclass={"build_py": BuildWithData},
)
