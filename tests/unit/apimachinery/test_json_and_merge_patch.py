"""JSON patch (RFC 6902) and JSON merge patch (RFC 7386) as the API server applies them."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.apimachinery.json_patch import JsonPatchError, apply_json_patch, format_pointer, parse_pointer
from trainyard.apimachinery.merge_patch import create_merge_patch, json_merge_patch

DOC = {
    "metadata": {"labels": {"app": "x"}, "annotations": {"example.com/a~b": "1"}},
    "spec": {"items": [1, 2, 3], "replicas": 1},
}


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        ([{"op": "add", "path": "/metadata/labels/team", "value": "ml"}],
         {**DOC, "metadata": {**DOC["metadata"], "labels": {"app": "x", "team": "ml"}}}),
        ([{"op": "add", "path": "/spec/items/-", "value": 4}], {**DOC, "spec": {"items": [1, 2, 3, 4], "replicas": 1}}),
        ([{"op": "add", "path": "/spec/items/0", "value": 0}], {**DOC, "spec": {"items": [0, 1, 2, 3], "replicas": 1}}),
        ([{"op": "remove", "path": "/spec/items/1"}], {**DOC, "spec": {"items": [1, 3], "replicas": 1}}),
        ([{"op": "replace", "path": "/spec/replicas", "value": 3}], {**DOC, "spec": {"items": [1, 2, 3], "replicas": 3}}),
        ([{"op": "move", "from": "/spec/replicas", "path": "/spec/count"}], {**DOC, "spec": {"items": [1, 2, 3], "count": 1}}),
        ([{"op": "copy", "from": "/spec/items/0", "path": "/spec/first"}],
         {**DOC, "spec": {"items": [1, 2, 3], "replicas": 1, "first": 1}}),
        ([{"op": "test", "path": "/spec/replicas", "value": 1.0}], DOC),
        # ~1 is '/', ~0 is '~' inside a key
        ([{"op": "remove", "path": "/metadata/annotations/example.com~1a~0b"}],
         {**DOC, "metadata": {"labels": {"app": "x"}, "annotations": {}}}),
        ([{"op": "replace", "path": "", "value": {"a": 1}}], {"a": 1}),
    ],
)
def test_json_patch_operations(operations: list, expected: dict) -> None:
    assert apply_json_patch(DOC, operations) == expected


def test_json_patch_pointer_escaping_round_trips() -> None:
    assert parse_pointer("/metadata/labels/a~1b~0c") == ["metadata", "labels", "a/b~c"]
    assert format_pointer(["metadata", "labels", "a/b~c"]) == "/metadata/labels/a~1b~0c"


@pytest.mark.parametrize(
    ("operations", "message"),
    [
        ([{"op": "remove", "path": "/spec/missing"}], r"operation 0 \(remove '/spec/missing'\): path /spec/missing does not exist"),
        ([{"op": "add", "path": "/spec/items/9", "value": 1}], "operation 0 .*out of range"),
        ([{"op": "test", "path": "/spec/replicas", "value": 2}], "operation 0 .*test failed"),
        ([{"op": "test", "path": "/spec/replicas", "value": True}], "test failed"),
        ([{"op": "add", "path": "/spec/x", "value": 1}, {"op": "frob", "path": "/a"}], "operation 1: unknown op 'frob'"),
        ([{"op": "add", "path": "/spec/x"}], "missing 'value'"),
        ([{"op": "move", "from": "/spec", "path": "/spec/inner"}], "own children"),
        ([{"op": "add", "path": "spec", "value": 1}], "must start with '/'"),
        ([{"op": "remove", "path": "/a~2b"}], "invalid '~' escape"),
        ([{"op": "replace", "path": "/spec/items/01", "value": 1}], "not a valid array index"),
        ({"op": "add"}, "must be a JSON array"),
    ],
)
def test_json_patch_errors_name_the_failing_operation(operations, message: str) -> None:
    with pytest.raises(JsonPatchError, match=message):
        apply_json_patch(DOC, operations)


def test_json_patch_is_all_or_nothing() -> None:
    doc = {"a": 1}
    with pytest.raises(JsonPatchError):
        apply_json_patch(doc, [{"op": "add", "path": "/b", "value": 2}, {"op": "remove", "path": "/zz"}])
    assert doc == {"a": 1}


def test_merge_patch_rfc7386_examples() -> None:
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},
              "tags": ["example", "sample"], "content": "This will be unchanged"}
    patch = {"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": None}, "tags": ["example"]}
    assert json_merge_patch(target, patch) == {
        "title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
        "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890"}
    assert json_merge_patch({"a": "b"}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}
    assert json_merge_patch({"a": [1]}, ["c"]) == ["c"]
    assert json_merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=10,
)
json_values_without_nulls = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)
json_objects_without_nulls = st.dictionaries(st.text(max_size=3), json_values_without_nulls, max_size=4)


@settings(max_examples=40, deadline=None)
@given(json_objects_without_nulls)
def test_merge_patch_of_a_document_with_itself_is_identity(document: dict) -> None:
    assert json_merge_patch(document, document) == document


@settings(max_examples=40, deadline=None)
@given(json_objects_without_nulls, json_objects_without_nulls)
def test_created_merge_patch_turns_source_into_target(source: dict, target: dict) -> None:
    assert json_merge_patch(source, create_merge_patch(source, target)) == target


@settings(max_examples=40, deadline=None)
@given(json_values)
def test_json_patch_replace_root_then_test_succeeds(value) -> None:
    assert apply_json_patch({"x": 1}, [{"op": "replace", "path": "", "value": value},
                                       {"op": "test", "path": "", "value": value}]) == value
