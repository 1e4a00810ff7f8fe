"""bench/structure.py --check: the counts it holds the tree to find what they say they find."""
from __future__ import annotations

from pathlib import Path

from fixtures.benchmodules import load_bench

structure = load_bench("structure")

LOGIC = '''
def {name}(items, limit):
    kept = []
    for item in items:
        if item.size > limit and not item.hidden:
            kept.append(item.name.upper())
        elif item.size == limit:
            kept.insert(0, item.name)
    total = sum(len(name) for name in kept)
    return kept, total
'''


def test_a_copied_function_with_other_names_is_a_pair_and_fields_are_not(tmp_path: Path) -> None:
    first, second, third = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    first.write_text("import os\n" + LOGIC.format(name="pick"))
    second.write_text(LOGIC.format(name="choose").replace("limit", "bound").replace("kept", "chosen"))
    fields = "from dataclasses import dataclass\n\n@dataclass\nclass Row:\n" + "".join(
        f"    field_{i}: int = {i}\n" for i in range(12))
    third.write_text(fields + "\n\n" + fields.replace("Row", "Other"))
    pairs = structure.duplicate_pairs([first, second, third])
    assert list(pairs) == [(structure._shown(first), structure._shown(second))]


def test_module_state_is_a_name_a_function_changes_not_a_constant(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "LIMITS = {'a': 1}\n_SEEN: dict = {}\n_COUNT = 0\n_LOCAL = []\n_CACHE = Cache()\n\n"
        "def remember(key):\n    _SEEN[key] = True\n\n"
        "def bump():\n    global _COUNT\n    _COUNT += 1\n\n"
        "def read():\n    return LIMITS['a'] + _CACHE.get('a')\n\n"
        "def shadow():\n    _LOCAL = []\n    _LOCAL.append(1)\n    return _LOCAL\n")
    assert [entry.rsplit(":", 1)[1] for entry in structure.module_state(module)] == ["_CACHE", "_COUNT", "_SEEN"]


def test_a_cycle_is_found_through_any_number_of_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(structure._strongly_connected(graph)) == [["a", "b", "c"], ["e"]]
