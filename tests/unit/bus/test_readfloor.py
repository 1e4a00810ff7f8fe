"""Read floors (trainyard.bus.readfloor): what one process stamps on its messages raises the
floors of whoever handles them, floors only rise, and a malformed header changes nothing."""
from __future__ import annotations

from trainyard.bus import readfloor


class Connection:  # floors are kept per NATS connection (weakly referenced)
    pass


def test_a_header_raises_the_handlers_floors_and_never_lowers_them() -> None:
    writer, reader = Connection(), Connection()
    assert readfloor.header_value(writer) == "" and readfloor.floor(reader, "ty_objects") == 0
    readfloor.raise_floor(writer, "ty_objects", 812)
    readfloor.raise_floor(writer, "ty_applied", 97)
    readfloor.raise_floor(writer, "ty_applied", 90)  # an older sequence: ignored
    readfloor.raise_floor(reader, "ty_objects", 900)
    readfloor.merge_header(reader, readfloor.header_value(writer))
    assert (readfloor.floor(reader, "ty_objects"), readfloor.floor(reader, "ty_applied")) == (900, 97)


def test_a_malformed_header_changes_nothing() -> None:
    reader = Connection()
    for value in ("", None, "ty_objects", "ty_objects=", "ty_objects=-3", "=5", "ty_objects=x,,"):
        readfloor.merge_header(reader, value)
    assert readfloor.header_value(reader) == ""
    readfloor.merge_header(reader, "ty_objects=abc,ty_outcomes=7")
    assert readfloor.header_value(reader) == "ty_outcomes=7"
