"""The error every entry point answers bad user input with: one line, an exit code, no traceback."""
from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input: printed as one line, never as a traceback."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
