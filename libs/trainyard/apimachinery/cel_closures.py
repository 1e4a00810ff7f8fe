"""cel-python's parse tree compiled into Python closures: the same evaluation, without the tree walk.

cel-python interprets an expression by visiting its parse tree on every evaluation; each
literal sits under nine single-child nodes, so a policy expression costs about a millisecond.
``compile_tree`` turns the tree into nested closures once. Every operation calls the very
functions cel-python's ``Evaluator`` calls (its operator table, the Kubernetes library
functions), with the same treatment of errors: errors are values that propagate through
operators and are absorbed by ``&&``, ``||`` and ``?:`` exactly as there; macros (``all``,
``exists``, ``exists_one``, ``map``, ``filter``) follow ``Evaluator.member_dot_arg``. A node
it does not handle (message construction, ``.ident``, ``reduce``, bytes and uint literals)
makes ``compile_tree`` answer None, and the caller keeps cel-python's interpreter for that
expression. ``tests/unit/apimachinery/test_cel_closures.py`` checks the two agree, value by
value and error by error, on every expression of deploy/policy and a table of CEL shapes.

One deliberate difference: once the left side of ``&&`` (``||``) is false (true), the right
side is not evaluated. cel-python evaluates it, and a ``map``/``filter`` failing there ends its
whole evaluation with an error; cel-go, like these closures, answers false (true).
``compile_tree(..., eager_logic=True)`` evaluates that right side anyway and lets what it
raises end the evaluation, as cel-python does: CRD rules (``cel.compile_rule``) use it to keep
the interpreter's verdicts exactly.
"""
from __future__ import annotations

from functools import reduce
from typing import Any, Callable

from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions, celstr

Closure = Callable[[dict[str, Any]], Any]

_RELATIONS = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_ge": "_>=_", "relation_gt": "_>_",
              "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "_in_"}
_ADDITIONS = {"addition_add": "_+_", "addition_sub": "_-_"}
_MULTIPLICATIONS = {"multiplication_mul": "_*_", "multiplication_div": "_/_", "multiplication_mod": "_%_"}
_MACROS = {"map", "filter", "all", "exists", "exists_one"}


def _is_tree(node: Any) -> bool:
    """A parse-tree node (lark's Tree), as opposed to a token."""
    return hasattr(node, "data") and hasattr(node, "children")


class Unsupported(Exception):
    """A node this compiler leaves to cel-python's interpreter."""


def _error(message: str, cause: BaseException | None = None) -> CELEvalError:
    err = CELEvalError(message, type(cause) if cause else None, cause.args if cause else None)
    if cause is not None:
        err.__cause__ = cause
    return err


class _Compiler:
    def __init__(self, functions: dict[str, Callable[..., Any]], eager_logic: bool = False) -> None:
        self.functions = dict(base_functions)
        self.functions.update(functions)
        self.eager_logic = eager_logic

    def function(self, name: str) -> Callable[..., Any]:
        if name not in self.functions:
            raise Unsupported(f"unknown function {name}")
        return self.functions[name]

    # -- dispatch ---------------------------------------------------------------------------

    def compile(self, tree: Any) -> Closure:
        if not _is_tree(tree):
            raise Unsupported(f"token {tree!r}")
        method = getattr(self, f"node_{tree.data}", None)
        if method is None:
            raise Unsupported(str(tree.data))
        return method(tree)

    def single(self, tree: Any) -> Closure:
        return self.compile(tree.children[0])

    # -- operators --------------------------------------------------------------------------

    def node_expr(self, tree: Any) -> Closure:
        if len(tree.children) == 1:
            return self.single(tree)
        cond, left, right = (self.compile(c) for c in tree.children)
        func = self.function("_?_:_")

        def ternary(env: dict[str, Any]) -> Any:
            value = cond(env)
            a = b = celtypes.BoolType(False)
            try:
                if value:
                    a = left(env)
                else:
                    b = right(env)
                return func(value, a, b)
            except TypeError as ex:
                return _error(f"found no matching overload for _?_:_ applied to "
                              f"'({type(value)}, {type(a)}, {type(b)})'", ex)
        return ternary

    def _logical(self, tree: Any, name: str, decided: bool) -> Closure:
        """``&&`` / ``||``: cel-python's ``logical_and``/``logical_or`` answer ``decided`` as soon
        as the left side is that bool, whatever the right side is (an error included), so the
        right side is not evaluated then (with ``eager_logic`` it is, for what it may raise)."""
        left, right = (self.compile(c) for c in tree.children)
        func = self.function(name)
        eager = self.eager_logic

        def logical(env: dict[str, Any]) -> Any:
            a = left(env)
            if isinstance(a, celtypes.BoolType) and bool(a) is decided:
                if eager:
                    right(env)  # an error value is absorbed; a raised one ends the evaluation
                return celtypes.BoolType(decided)
            b = right(env)
            try:
                return func(a, b)
            except TypeError as ex:
                return _error(f"found no matching overload for {name} applied to '({type(a)}, {type(b)})'", ex)
        return logical

    def node_conditionalor(self, tree: Any) -> Closure:
        return self.single(tree) if len(tree.children) == 1 else self._logical(tree, "_||_", True)

    def node_conditionaland(self, tree: Any) -> Closure:
        return self.single(tree) if len(tree.children) == 1 else self._logical(tree, "_&&_", False)

    def _arithmetic(self, tree: Any, names: dict[str, str]) -> Closure:
        if len(tree.children) == 1:
            return self.single(tree)
        op_tree, right_tree = tree.children
        name = names[op_tree.data]
        left = self.compile(op_tree.children[0])
        right = self.compile(right_tree)
        func = self.function(name)
        relation = names is _RELATIONS

        def operation(env: dict[str, Any]) -> Any:
            a, b = left(env), right(env)
            try:
                return func(a, b)
            except TypeError as ex:
                return _error(f"found no matching overload for {op_tree.data!r} applied to "
                              f"'({type(a)}, {type(b)})'", ex)
            except ZeroDivisionError as ex:
                if relation:
                    raise
                return _error("modulus or divide by zero", ex)
            except (ValueError, OverflowError) as ex:
                if relation:
                    raise
                return _error("return error for overflow", ex)
        return operation

    def node_relation(self, tree: Any) -> Closure:
        return self._arithmetic(tree, _RELATIONS)

    def node_addition(self, tree: Any) -> Closure:
        return self._arithmetic(tree, _ADDITIONS)

    def node_multiplication(self, tree: Any) -> Closure:
        return self._arithmetic(tree, _MULTIPLICATIONS)

    def node_unary(self, tree: Any) -> Closure:
        if len(tree.children) == 1:
            return self.single(tree)
        op_tree, operand_tree = tree.children
        name = {"unary_not": "!_", "unary_neg": "-_"}[op_tree.data]
        operand = self.compile(operand_tree)
        func = self.function(name)

        def unary(env: dict[str, Any]) -> Any:
            value = operand(env)
            try:
                return func(value)
            except TypeError as ex:
                return _error(f"found no matching overload for {op_tree.data!r} applied to '({type(value)})'", ex)
            except ValueError as ex:
                return _error("return error for overflow", ex)
        return unary

    # -- members ----------------------------------------------------------------------------

    def node_member(self, tree: Any) -> Closure:
        return self.single(tree)

    def node_member_dot(self, tree: Any) -> Closure:
        member_tree, name_token = tree.children
        member = self.compile(member_tree)
        name = celtypes.StringType(name_token.value)

        def dot(env: dict[str, Any]) -> Any:
            value = member(env)
            if isinstance(value, CELEvalError):
                return value
            if isinstance(value, celtypes.MapType):
                try:
                    return value[name]
                except KeyError:
                    return _error(f"no such member in mapping: {str(name)!r}")
            if isinstance(value, celtypes.MessageType):
                return value.get(name)
            return _error(f"{value!r} with type: '{type(value)}' does not support field selection")
        return dot

    def node_member_index(self, tree: Any) -> Closure:
        member, index = (self.compile(c) for c in tree.children)
        func = self.function("_[_]")

        def item(env: dict[str, Any]) -> Any:
            a, b = member(env), index(env)
            try:
                return func(a, b)
            except TypeError as ex:
                return _error(f"found no matching overload for _[_] applied to '({type(a)}, {type(b)})'", ex)
            except KeyError as ex:
                return _error("no such key", ex)
            except IndexError as ex:
                return _error("invalid_argument", ex)
        return item

    def _arguments(self, tree: Any) -> list[Closure]:
        if tree is None:
            return []
        if not _is_tree(tree) or tree.data != "exprlist":
            raise Unsupported("argument list")
        return [self.compile(c) for c in tree.children]

    def node_member_dot_arg(self, tree: Any) -> Closure:
        member_tree, name_token = tree.children[:2]
        name = name_token.value
        if name in _MACROS:
            return self._macro(tree, name)
        if name in ("reduce", "min"):
            raise Unsupported(f"macro {name}")  # cel-python treats .min() as a macro: leave it there
        member = self.compile(member_tree)
        arguments = self._arguments(tree.children[2] if len(tree.children) > 2 else None)
        func = self.function(name)

        def method(env: dict[str, Any]) -> Any:
            target = member(env)
            values = [a(env) for a in arguments]
            if isinstance(target, CELEvalError):
                return target
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            try:
                return func(target, *values)
            except ValueError as ex:
                return _error("return error for overflow", ex)
            except (TypeError, AttributeError) as ex:
                return _error("no such overload", ex)
        return method

    def _macro(self, tree: Any, name: str) -> Closure:
        member = self.compile(tree.children[0])
        args = tree.children[2] if len(tree.children) > 2 else None
        if not _is_tree(args) or len(args.children) != 2:
            raise Unsupported(f"macro {name} arity")
        var_tree, body_tree = args.children
        idents = list(var_tree.find_data("ident"))
        if len(idents) != 1:
            raise Unsupported("macro variable")
        variable = idents[0].children[0].value
        body = self.compile(body_tree)

        def strict(env: dict[str, Any]) -> Callable[[Any], Any]:
            def run(value: Any) -> Any:  # an error ends the whole evaluation, as Evaluator.evaluate raises it
                result = body({**env, variable: value})
                if isinstance(result, CELEvalError):
                    raise result
                return result
            return run

        def lenient(env: dict[str, Any]) -> Callable[[Any], Any]:
            return lambda value: body({**env, variable: value})

        and_oper = _overload_guard(celtypes.logical_and)
        or_oper = _overload_guard(celtypes.logical_or)

        def macro(env: dict[str, Any]) -> Any:
            items = member(env)
            if isinstance(items, CELEvalError):
                return items
            if name == "map":
                return celtypes.ListType(map(strict(env), items))
            if name == "filter":
                return celtypes.ListType(filter(strict(env), items))
            if name == "all":
                return reduce(and_oper, map(lenient(env), items), celtypes.BoolType(True))
            if name == "exists":
                return reduce(or_oper, map(lenient(env), items), celtypes.BoolType(False))
            run = strict(env)
            return celtypes.BoolType(sum(1 for value in items if bool(run(value))) == 1)
        return macro

    # -- primaries --------------------------------------------------------------------------

    def node_primary(self, tree: Any) -> Closure:
        child = tree.children[0]
        data = child.data
        if data == "literal":
            return self.node_literal(child)
        if data == "paren_expr":
            return self.compile(child.children[0])
        if data == "list_lit":
            if not child.children:
                return lambda env: celtypes.ListType()
            items = self._arguments(child.children[0])

            def list_literal(env: dict[str, Any]) -> Any:
                values = [i(env) for i in items]
                for value in values:
                    if isinstance(value, CELEvalError):
                        return value
                return celtypes.ListType(values)
            return list_literal
        if data == "map_lit":
            return self._map_literal(child)
        if data == "ident":
            name = child.children[0].value

            builtin = self.functions.get(name)  # type names (int, string, ...) are identifiers too

            def ident(env: dict[str, Any]) -> Any:
                try:
                    return env[name]
                except KeyError as ex:
                    if isinstance(builtin, type):
                        return builtin
                    return _error(f"undeclared reference to '{name}'", ex)
            return ident
        if data == "ident_arg":
            return self._call(child)
        raise Unsupported(str(data))

    def _map_literal(self, tree: Any) -> Closure:
        if not tree.children:
            return lambda env: celtypes.MapType()
        inits = tree.children[0]
        if not _is_tree(inits) or inits.data != "mapinits":
            raise Unsupported("map literal")
        parts = [self.compile(c) for c in inits.children]

        def map_literal(env: dict[str, Any]) -> Any:
            values = [p(env) for p in parts]
            result = celtypes.MapType()
            try:
                for key, value in zip(values[0::2], values[1::2]):
                    if key in result:
                        raise ValueError(f"Duplicate key {key!r}")
                    result[key] = value
            except (ValueError, TypeError) as ex:
                return _error(ex.args[0] if ex.args else str(ex), ex)
            return result
        return map_literal

    def _call(self, tree: Any) -> Closure:
        name = tree.children[0].value
        exprlist = tree.children[1] if len(tree.children) > 1 else None
        if name == "has":
            if exprlist is None or len(exprlist.children) != 1:
                raise Unsupported("has arity")
            probe = self.compile(exprlist.children[0])
            return lambda env: celtypes.BoolType(not isinstance(probe(env), CELEvalError))
        arguments = self._arguments(exprlist)
        if name == "dyn":
            if len(arguments) != 1:
                raise Unsupported("dyn arity")
            return arguments[0]
        func = self.function(name)

        def call(env: dict[str, Any]) -> Any:
            values = [a(env) for a in arguments]
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            try:
                return func(*values)
            except ValueError as ex:
                return _error("return error for overflow", ex)
            except (TypeError, AttributeError) as ex:
                return _error("no such overload", ex)
        return call

    def node_literal(self, tree: Any) -> Closure:
        token = tree.children[0]
        kind = token.type
        try:
            if kind == "FLOAT_LIT":
                value: Any = celtypes.DoubleType(token.value)
            elif kind == "INT_LIT":
                value = celtypes.IntType(token.value)
            elif kind in ("MLSTRING_LIT", "STRING_LIT"):
                value = celstr(token)
            elif kind == "BOOL_LIT":
                value = celtypes.BoolType(token.value.lower() == "true")
            elif kind == "NULL_LIT":
                value = None
            else:
                raise Unsupported(f"literal {kind}")
        except ValueError as ex:
            failed = _error(ex.args[0] if ex.args else str(ex), ex)
            return lambda env: failed
        return lambda env: value


def _overload_guard(func: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def guarded(a: Any, b: Any) -> Any:
        try:
            return func(a, b)
        except TypeError as ex:
            return _error("no such overload", ex)
    return guarded


def compile_tree(tree: Any, functions: dict[str, Callable[..., Any]], eager_logic: bool = False) -> Closure | None:
    """Closures for cel-python's parse ``tree`` (the ``expr`` root), or None when a node is
    left to cel-python's interpreter. ``eager_logic``: evaluate the right side of a decided
    ``&&``/``||`` too, as cel-python does (see the module's text)."""
    try:
        return _Compiler(functions, eager_logic).compile(tree)
    except Unsupported:
        return None


# -- what a rule reads of ``self`` ------------------------------------------------------------

# Nodes that only pass their one child's value on.
_WRAPPERS = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member",
             "primary", "paren_expr"}
ITEMS = None  # a path step: every item of a list
FULL, PRESENT, ITERATED = "full", "present", "iterated"


class Need:
    """What an expression reads of one value: all of it (``full``), some of its fields (a map),
    or its items (a list iterated by a macro); a value only tested by ``has()`` needs nothing."""

    __slots__ = ("full", "fields", "items")

    def __init__(self) -> None:
        self.full = False
        self.fields: dict[str, Need] = {}
        self.items: Need | None = None


def _unwrap(tree: Any) -> Any:
    while _is_tree(tree) and tree.data in _WRAPPERS and len(tree.children) == 1 and _is_tree(tree.children[0]):
        tree = tree.children[0]
    return tree


def _path_of(tree: Any, scope: dict[str, tuple | None]) -> tuple | None:
    """The path from ``self`` of a value written ``self.a.b`` (or ``x.b`` for a macro variable
    ``x`` that iterates such a value); None for any other expression."""
    node = _unwrap(tree)
    if not _is_tree(node):
        return None
    if node.data == "ident":
        return scope.get(node.children[0].value)
    if node.data == "member_dot":
        base = _path_of(node.children[0], scope)
        return None if base is None else base + (node.children[1].value,)
    return None


def _demands(tree: Any, scope: dict[str, tuple | None], demand: str, out: list[tuple[tuple, str]]) -> None:
    path = _path_of(tree, scope)
    if path is not None:
        out.append((path, demand))
        return
    node = _unwrap(tree)
    if not _is_tree(node):
        return
    if node.data == "ident_arg" and node.children[0].value == "has" and len(node.children) > 1 \
            and _is_tree(node.children[1]):
        for child in node.children[1].children:  # has(e.f) reads whether e.f exists, not its value
            _demands(child, scope, PRESENT, out)
        return
    if node.data == "member_dot_arg" and node.children[1].value in _MACROS and len(node.children) > 2 \
            and _is_tree(node.children[2]) and len(node.children[2].children) == 2:
        var_tree, body = node.children[2].children
        idents = list(var_tree.find_data("ident"))
        if len(idents) == 1:
            target = _path_of(node.children[0], scope)
            if target is not None:
                out.append((target, ITERATED))
            else:
                _demands(node.children[0], scope, FULL, out)
            inner = {**scope, idents[0].children[0].value: None if target is None else target + (ITEMS,)}
            _demands(body, inner, FULL, out)
            return
    for child in node.children:
        if _is_tree(child):
            _demands(child, scope, FULL, out)


def self_need(tree: Any) -> Need | None:
    """What the expression ``tree`` reads of ``self``; None when it reads all of it. Only
    ``self.a.b`` chains, ``has()`` and macro iteration narrow it: a value used in any other way
    (compared, passed to a function, indexed, a method's target) is read in full."""
    out: list[tuple[tuple, str]] = []
    _demands(tree, {"self": ()}, FULL, out)
    root = Need()
    for path, demand in out:
        node = root
        for step in path:
            if node.full:
                break
            if step is ITEMS:
                node.items = node.items or Need()
                node = node.items
            else:
                node = node.fields.setdefault(step, Need())
        else:
            if demand == FULL:
                node.full = True
            elif demand == ITERATED:
                node.items = node.items or Need()
    return None if root.full else root
