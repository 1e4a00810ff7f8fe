"""Which upstream release trainyard behaves as where Kubeflow Trainer v2.1.0 and v2.3.0 differ.

One value, chosen per deployment (``--trainer-compat`` / ``TRAINYARD_TRAINER_COMPAT`` on the
planner and status services and on ``trainyard up``): ``v2.3`` (the default, the newest release)
or ``v2.1`` (every v2.1.0 behaviour trainyard had before v2.3.0 became the default, for clusters
that pin v2.1). docs/compatibility.md lists, row by row, what each level does.
"""
from __future__ import annotations

import argparse
import enum
import os


class TrainerCompat(str, enum.Enum):
    V2_3 = "v2.3"
    V2_1 = "v2.1"

    @property
    def v2_3(self) -> bool:
        """Whether v2.3.0's behaviour applies (the default)."""
        return self is TrainerCompat.V2_3

    def __str__(self) -> str:
        return self.value


DEFAULT_COMPAT = TrainerCompat.V2_3
COMPAT_ENV = "TRAINYARD_TRAINER_COMPAT"
FLAG = "--trainer-compat"


def parse_compat(value: object, source: str = FLAG) -> TrainerCompat:
    """The level named by ``value`` (``v2.3`` or ``v2.1``; ``2.3``/``2.1`` accepted); ValueError
    naming ``source`` otherwise."""
    text = str(value).strip() if value is not None else ""
    if text and not text.startswith("v"):
        text = "v" + text
    for level in TrainerCompat:
        if text == level.value:
            return level
    allowed = ", ".join(level.value for level in TrainerCompat)
    raise ValueError(f"{source}: expected one of {allowed}, got {value!r}")


def add_compat_argument(parser: argparse.ArgumentParser) -> None:
    """``--trainer-compat`` with the environment variable as default (the services' convention)."""
    parser.add_argument(FLAG, dest="trainer_compat", default=os.environ.get(COMPAT_ENV, DEFAULT_COMPAT.value),
                        metavar="LEVEL",
                        help=f"upstream Kubeflow Trainer behaviour where v2.1.0 and v2.3.0 differ: v2.3 (default) "
                             f"or v2.1 (docs/compatibility.md; env {COMPAT_ENV})")


def compat_from_args(args: argparse.Namespace, user_error: type[Exception]) -> TrainerCompat:
    try:
        return parse_compat(getattr(args, "trainer_compat", DEFAULT_COMPAT.value))
    except ValueError as err:
        raise user_error(str(err)) from None
