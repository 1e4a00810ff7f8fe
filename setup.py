"""Maps the repository layout onto importable packages.

libs/trainyard -> trainyard (all logic), services/ -> trainyard_services (process wiring).
A built wheel also carries deploy/ and examples/ as package data under trainyard/_data/, so a
non-editable install finds its CRDs, runtimes and manifests (trainyard.packaged locates them).
"""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_DIRS = ("deploy", "examples")

library_packages = find_packages("libs", include=["trainyard", "trainyard.*"])
service_packages = [
    "trainyard_services" + name[len("services"):]
    for name in find_packages(".", include=["services", "services.*"])
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
    package_data={"trainyard": ["**/*.yaml", "**/*.json"],
                  "trainyard_services": ["dashboard/static/*"]},
    cmdclass={"build_py": BuildWithData},
)
