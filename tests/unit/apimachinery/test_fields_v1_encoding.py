"""FieldsV1 trees (managedFields) are encoded as before: the same keys in the same order, key
by key, for field sets of every element kind, including a member that has owned children and
an empty field name (whose order against the "." marker is the stable sort's)."""
from __future__ import annotations

import json
import random
from typing import Any

from trainyard.apimachinery.fieldpath import (element_sort_key, from_fields_v1, key_element, path_sort_key,
                                              to_fields_v1, _parse_element)


def reference_fields_v1(fields: set) -> dict[str, Any]:
    """The encoding the API server used before (sorted paths into a tree, then every level
    re-sorted with the "." marker added), kept here to compare with."""
    members = set(fields)
    tree: dict[str, Any] = {}
    for path in sorted(members, key=path_sort_key):
        node = tree
        for element in path:
            node = node.setdefault(f"{element[0]}:{element[1]}", {})

    def mark(node: dict[str, Any], prefix: tuple) -> None:
        for key, child in node.items():
            if key == ".":
                continue
            path = prefix + (_parse_element(key),)
            if child and path in members:
                child["."] = {}
            mark(child, path)
        ordered = sorted(node.items(), key=lambda item: (0, "") if item[0] == "." else element_sort_key(
            _parse_element(item[0])))
        node.clear()
        node.update(ordered)

    mark(tree, ())
    return tree


ELEMENTS = [("f", "spec"), ("f", "metadata"), ("f", ""), ("f", "a:b"), ("f", "replicatedJobs"), ("f", "Ünïcode"),
            ("k", '{"name":"node"}'), ("k", '{"name":"init"}'), ("k", '{"containerPort":80,"protocol":"TCP"}'),
            ("v", '"a"'), ("v", "1"), ("i", "0"), ("i", "10")]


def random_field_set(rng: random.Random) -> set:
    fields = set()
    for _ in range(rng.randint(1, 40)):
        path = tuple(rng.choice(ELEMENTS) for _ in range(rng.randint(1, 5)))
        fields.add(path)
        if rng.random() < 0.3:
            fields.add(path[:rng.randint(1, len(path))])  # a member with owned children
    return fields


def test_fields_v1_trees_are_encoded_as_before() -> None:
    rng = random.Random(16)
    for _ in range(2000):
        fields = random_field_set(rng)
        encoded = to_fields_v1(fields)
        assert json.dumps(encoded) == json.dumps(reference_fields_v1(fields)), fields
        assert from_fields_v1(encoded) == fields


def test_an_empty_field_name_orders_as_before_against_the_member_marker() -> None:
    fields = {(("f", "spec"),), (("f", "spec"), ("f", "")), (("f", "spec"), ("f", "x"))}
    assert json.dumps(to_fields_v1(fields)) == json.dumps(reference_fields_v1(fields))
    assert list(to_fields_v1(fields)["f:spec"]) == ["f:", ".", "f:x"]


def test_key_elements_of_equal_python_values_with_different_json_stay_apart() -> None:
    """Key elements are remembered by their fields: 1, True and 1.0 (equal in Python) and 0.0
    and -0.0 are different keys in JSON, each with its own text, in any order of asking."""
    for _ in range(2):
        assert key_element({"port": 1}) == ("k", '{"port":1}')
        assert key_element({"port": True}) == ("k", '{"port":true}')
        assert key_element({"port": 1.0}) == ("k", '{"port":1.0}')
        assert key_element({"port": -0.0}) == ("k", '{"port":-0.0}')
        assert key_element({"port": 0.0}) == ("k", '{"port":0.0}')
        assert key_element({"protocol": "TCP", "port": 80}) == ("k", '{"port":80,"protocol":"TCP"}')
        assert key_element({"name": {"a": [1]}}) == ("k", '{"name":{"a":[1]}}')
