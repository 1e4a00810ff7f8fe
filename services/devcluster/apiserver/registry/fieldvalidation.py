"""``fieldValidation`` (Strict, Warn, Ignore): what a write does with fields its kind does not know."""
from __future__ import annotations

from .. import errors
from .options import WriteOptions


def report_unknown(unknown: list[str], opts: WriteOptions) -> None:
    """Strict: 400 ``strict decoding error: unknown field "<path>"`` (every one listed); Warn:
    one warning per field; Ignore: nothing."""
    if not unknown:
        return
    mode = opts.field_validation or "Strict"
    if mode == "Strict":
        if len(unknown) == 1:
            raise errors.bad_request(f'strict decoding error: unknown field "{unknown[0]}"')
        raise errors.bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
    if mode == "Warn":
        opts.warnings.extend(f'unknown field "{u}"' for u in unknown)
