"""Shared pytest set-up.

Fixture modules live in tests/fixtures/ (one per real component a test can start: NATS,
devcluster, the service stack); every module there is loaded as a pytest plugin.
"""
from pathlib import Path

pytest_plugins = sorted(
    f"fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if not path.stem.startswith("_")
)
