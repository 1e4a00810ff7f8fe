"""Admission webhooks: call Mutating then Validating webhook configurations (AdmissionReview v1)."""
from __future__ import annotations

from typing import Any


class Admission:
    def __init__(self, api: Any) -> None:
        self.api = api

    async def admit(self, operation: str, rt: Any, obj: dict[str, Any] | None, old: dict[str, Any] | None,
                    opts: Any) -> dict[str, Any] | None:
        return None
