"""Label and field selectors select exactly what kubectl and the SDK expect."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.apimachinery.errors import SelectorError
from trainyard.apimachinery.selectors import (
    label_selector_from_struct,
    parse_field_selector,
    parse_label_selector,
    supported_fields_for,
)

NODE = {"jobset.sigs.k8s.io/jobset-name": "job", "jobset.sigs.k8s.io/replicatedjob-name": "node", "idx": "3"}


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("a in (x,y)", {"a": "y"}, True),
        ("a in (x,y)", {}, False),
        ("a notin (x)", {}, True),
        ("a notin (x)", {"a": "x"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("!a", {"b": "1"}, True),
        ("a=", {"a": ""}, True),
        ("a in ()", {"a": ""}, True),
        ("idx>2,idx<4", NODE, True),
        ("idx>3", NODE, False),
        ("jobset.sigs.k8s.io/jobset-name=job,jobset.sigs.k8s.io/replicatedjob-name in "
         "(dataset-initializer, model-initializer, launcher, node)", NODE, True),
        (" a = b , c ", {"a": "b", "c": "1"}, True),
    ],
)
def test_label_selector_matching(selector: str, labels: dict, selected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is selected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("a in x", "found 'x', expected: '\\('"),
        ("a in (x", "expected: '\\)'"),
        ("=b", "found '=', expected: identifier"),
        ("a b", "found 'b', expected: '=', '!=', '==', 'in', notin'"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("a=b,", "found '', expected: identifier"),
        ("Bad_/x=1", "prefix part"),
        ("a=-bad-", "values\\[0\\]: Invalid value"),
        ("a>x", "must be an integer"),
    ],
)
def test_label_selector_parse_errors_are_clear(selector: str, message: str) -> None:
    with pytest.raises(SelectorError, match=f"unable to parse requirement: .*{message}"):
        parse_label_selector(selector)


def test_structured_label_selector() -> None:
    selector = label_selector_from_struct({
        "matchLabels": {"app": "x"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                             {"key": "gone", "operator": "DoesNotExist"}],
    })
    assert selector.matches({"app": "x", "tier": "b"})
    assert not selector.matches({"app": "x", "tier": "b", "gone": "1"})
    assert str(selector) == "app=x,tier in (a,b),!gone"
    assert parse_label_selector(str(selector)) == selector
    assert label_selector_from_struct({}).matches({"any": "thing"})
    assert not label_selector_from_struct(None).matches({})


@pytest.mark.parametrize(
    ("struct", "message"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, r"selector.matchExpressions\[0\].values: Required value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "Forbidden"),
        ({"matchExpressions": [{"key": "a", "operator": "Equals"}]}, r"matchExpressions\[0\].operator: Unsupported value"),
        ({"matchLabels": ["a"]}, "selector.matchLabels: must be a map"),
    ],
)
def test_structured_selector_errors_name_the_field(struct: dict, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        label_selector_from_struct(struct)


POD = {"metadata": {"name": "p", "namespace": "default"}, "status": {"phase": "Running"}, "spec": {"hostNetwork": False}}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("metadata.name=p", True),
        ("metadata.name==q", False),
        ("metadata.name!=q,metadata.namespace=default", True),
        ("status.phase=Running", True),
        ("status.phase!=Running", False),
        ("spec.hostNetwork=false", True),
        ("", True),
    ],
)
def test_field_selector_matching(selector: str, selected: bool) -> None:
    assert parse_field_selector(selector, supported_fields_for("", "pods")).matches(POD) is selected


def test_field_selector_rejects_unsupported_fields_and_garbage() -> None:
    with pytest.raises(SelectorError, match="field label not supported: status.phase"):
        parse_field_selector("status.phase=Running")
    with pytest.raises(SelectorError, match="invalid selector: 'metadata.name'; can't understand 'metadata.name'"):
        parse_field_selector("metadata.name")


def test_event_field_selectors_and_escaping() -> None:
    event = {"involvedObject": {"kind": "TrainJob", "name": "a,b"}, "source": {"component": "trainer"}}
    fields = supported_fields_for("", "events")
    assert parse_field_selector(r"involvedObject.kind=TrainJob,involvedObject.name=a\,b", fields).matches(event)
    assert parse_field_selector("source=trainer", fields).matches(event)
    selector = parse_field_selector(r"involvedObject.name=a\,b", fields)
    assert parse_field_selector(str(selector), fields) == selector


label_values = st.builds(lambda head, middle, tail: head + middle + tail if middle else head,
                         st.sampled_from("ab9"), st.text("a.-_z0", max_size=6), st.sampled_from("xy1"))


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "example.com/c"]), label_values, max_size=3))
def test_equality_selector_built_from_labels_selects_them(labels: dict) -> None:
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    assert parse_label_selector(selector).matches(labels)
    assert parse_label_selector(selector).matches({**labels, "other": "x"})
