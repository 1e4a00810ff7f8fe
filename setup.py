"""Maps the repository layout onto importable packages.

libs/trainyard -> trainyard (all logic), services/ -> trainyard_services (process wiring).
"""
from setuptools import find_packages, setup

library_packages = find_packages("libs", include=["trainyard", "trainyard.*"])
service_packages = [
    "trainyard_services" + name[len("services"):]
    for name in find_packages(".", include=["services", "services.*"])
]

setup(
    packages=library_packages + service_packages,
    package_dir={"trainyard": "libs/trainyard", "trainyard_services": "services"},
    include_package_data=True,
    package_data={"trainyard": ["**/*.yaml", "**/*.json"]},
)
