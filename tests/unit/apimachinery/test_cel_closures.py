"""The closures compiled from cel-python's parse tree answer what cel-python's interpreter
answers: the same value and type, or an error with the same text, for every expression of
deploy/policy and a table of CEL shapes, over several activations (objects with and without
the fields read, params present or not)."""
from __future__ import annotations

from pathlib import Path

import celpy
import pytest
import yaml

from trainyard.apimachinery.cel import cel_value, error_text, lazy_map
from trainyard.apimachinery.cel_closures import compile_tree
from trainyard.apimachinery.cel_library import FUNCTIONS

REPO = Path(__file__).resolve().parents[3]


def policy_expressions() -> list[str]:
    found = []
    for path in sorted((REPO / "deploy" / "policy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec") or {}
            for key in ("matchConditions", "variables", "validations"):
                for item in spec.get(key) or []:
                    found += [item[k] for k in ("expression", "messageExpression") if item.get(k)]
    return found


SHAPES = [
    "true", "false", "null", "1 + 2 * 3 - 4 / 2 % 3", "-(5)", "!true", "1.5 * 2.0", "'a' + 'b'", "[1, 2] + [3]",
    "1 < 2 && 2 <= 2 && 3 > 2 && 3 >= 3 && 1 != 2 && 1 == 1", "1 == 1.0", "1 / 0", "5 % 0",
    "9223372036854775807 + 1", "'x' in ['x', 'y']", "'k' in {'k': 1}", "{'a': 1, 'b': 2}['b']", "{'a': 1}['z']",
    "[1, 2, 3][5]", "[1, 2, 3][1]", "true ? 1 : 2", "false ? 1 : 'two'", "1 ? 2 : 3", "size([1, 2]) == 2",
    "size('abc')", "int('12') + 1", "int('x')", "string(3) + 'x'", "double(1) / 2.0", "type(1) == int",
    "type('a') == string", "dyn(1) + 1", "has(object.spec)", "has(object.spec.trainer.numNodes)",
    "has(object.metadata.labels) && 'a' in object.metadata.labels", "object.spec.trainer.numNodes * 2",
    "object.missing", "object.missing || true", "object.missing && false", "true || object.missing",
    "false && object.missing", "object.missing || false", "!object.missing", "object.metadata.name.startsWith('x')",
    "object.metadata.name.endsWith('z') || object.metadata.name.contains('-')",
    "object.metadata.name.matches('^[a-z]+$')", "[1, 2, 3].all(i, i > 0)", "[1, 2, 3].exists(i, i > 2)",
    "[1, 2, 3].exists_one(i, i > 1)", "[1, 2, 3].map(i, i * 2)", "[1, 2, 3].filter(i, i % 2 == 1)",
    "{'a': 1, 'b': 2}.all(k, k != 'c')", "[0, 1].all(i, 10 / i > 1)", "[0, 1].exists(i, 10 / i > 1)",
    "[0, 1].map(i, 10 / i)", "[[1, 2], [3]].map(l, l.map(i, i + 1))", "[1, 2].map(x, [x].exists(y, y == x))",
    "'a,b, c'.split(',').map(s, s.trim()).filter(s, s != '').join('|')",
    "quantity('1Gi').isGreaterThan(quantity('1000Mi'))", "quantity(string(object.spec.trainer.numNodes)).asInteger()",
    "request.userInfo.groups.exists(g, g in variables.groups)", "variables.groups.size() > 0",
    "variables.broken == 1", "variables.missing", "params.data.maxNodes", "int(params.data.maxNodes) > 3",
    "has(params.data) && 'maxNodes' in params.data ? int(params.data.maxNodes) : -1", "oldObject == null",
    "object.metadata.labels.a", "object.metadata.labels['a']", "nothing", "nothing.at.all", "[1, 2].unknownFn()",
    "size(nothing)", "'abc'.charAt(9)", "[].max()", "[3, 1].sort()", "1u + 2u", "b'abc'", "{1: 'a', 1: 'b'}",
    "[].max() == null && [1].min() == 1",
]

# Nodes the closures leave to cel-python: .min() (a macro there), unknown functions, uint and bytes literals.
LEFT_TO_THE_INTERPRETER = {"[1, 2].unknownFn()", "[3, 1].sort()", "1u + 2u", "b'abc'",
                           "[].max() == null && [1].min() == 1"}

OBJECTS = [
    {"metadata": {"name": "abc", "labels": {"a": "b"}}, "spec": {"trainer": {"numNodes": 3}}},
    {"metadata": {"name": "x-z"}, "spec": {}},
]
PARAMS = [{"data": {"maxNodes": "4"}}, {"data": {"maxNodes": "four"}}, {}, None]


def activations():
    for obj in OBJECTS:
        for params in PARAMS:
            def resolve(name):
                return cel_value(["system:masters"]) if name == "groups" else (_ for _ in ()).throw(
                    __import__("trainyard.apimachinery.cel", fromlist=["CelError"]).CelError("variable failed"))
            yield {"object": cel_value(obj), "oldObject": cel_value(None), "params": cel_value(params),
                   "request": cel_value({"userInfo": {"username": "u", "groups": ["system:masters"]},
                                         "subResource": "", "namespace": "ns"}),
                   "namespaceObject": cel_value(None),
                   "variables": lazy_map(resolve, ["groups", "broken"])}


def outcome(run, activation):
    try:
        value = run(activation)
    except Exception as err:  # noqa: BLE001 - any failure is compared by its text
        return ("error", error_text(err))
    if type(value).__name__ == "CELEvalError":
        return ("error", error_text(value))
    return ("value", type(value).__name__, repr(value))


@pytest.mark.parametrize("expression", policy_expressions() + SHAPES)
def test_closures_answer_what_the_interpreter_answers(expression):
    env = celpy.Environment()
    tree = env.compile(expression)
    interpreted = env.program(tree, functions=FUNCTIONS).evaluate
    closures = compile_tree(tree, FUNCTIONS)
    if closures is None:  # the whole expression stays on the interpreter
        assert expression in LEFT_TO_THE_INTERPRETER
        return
    assert expression not in LEFT_TO_THE_INTERPRETER
    for activation in activations():
        assert outcome(closures, activation) == outcome(interpreted, activation), activation


def test_every_policy_expression_is_compiled_to_closures():
    env = celpy.Environment()
    for expression in policy_expressions():
        assert compile_tree(env.compile(expression), FUNCTIONS) is not None, expression
