"""The one evaluator of CRD ``x-kubernetes-validations`` rules (CEL), pure and cached.

Every rule text is compiled once per process (``compile_rule`` is memoised) into a
``CompiledRule``: the cel-python program that defines the result, plus, for the few rule
shapes the generated CRDs use on every write (name format and length, ``self in [...]``,
``self > 0 || self in [...]``, ``has()`` logic, ``self == oldSelf``, ``!(A && B && ...)`` with a
``has()`` or string-equality term that is false), a native check. A native
check only ever answers *holds*: when it says no (or has nothing to say) the CEL program runs,
so a rejection and its wording always come from CEL itself. tests/unit/apiserver checks the
native checks against CEL value by value.

The program runs first as closures (``cel_closures.compile_tree`` with cel-python's eager
``&&``/``||``), a tenth of the interpreter's cost; only a bool from them is taken as the
verdict. Anything else (an error value, an exception, a non-bool) runs cel-python's
interpreter, so every error, overload and message is the interpreter's own.
tests/unit/apimachinery/test_crd_rules_closures.py checks both give the same verdicts and texts
on every rule of the shipped CRDs.

The devcluster API server and ``trainyard validate`` both evaluate rules here (through
``trainyard.apimachinery.structural``); nothing else evaluates CEL.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

_SELF_EQ_OLD = re.compile(r"^\s*self\s*==\s*oldSelf\s*$")
_NAME_MATCHES = re.compile(r"^\s*self\.metadata\.name\.matches\('([^']*)'\)\s*$")
_NAME_SIZE = re.compile(r"^\s*size\(self\.metadata\.name\)\s*<=\s*(\d+)\s*$")
_IN_LIST = re.compile(r"^\s*self\s+in\s+\[((?:\s*'[^']*'\s*,?)*)\]\s*$")
_POSITIVE_OR_IN_LIST = re.compile(r"^\s*self\s*>\s*0\s*\|\|\s*self\s+in\s+\[((?:\s*'[^']*'\s*,?)*)\]\s*$")
_HAS_TOKEN = re.compile(r"\s*(has\(self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\)|&&|\|\||!|\(|\))")
_OLD_SELF = re.compile(r"\boldSelf\b")
_SELF_PATH = r"self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)"
_HAS_TERM = re.compile(r"^\s*has\(" + _SELF_PATH + r"\)\s*$")
_EQUALS_STRING_TERM = re.compile(r"^\s*" + _SELF_PATH + r"\s*==\s*'([^'\\]*)'\s*$")

# A native check: (self, oldSelf) -> True when the rule certainly holds.
NativeCheck = Callable[[Any, Any], bool]


class CelError(Exception):
    """A rule that does not compile or cannot be evaluated on the given value."""


@dataclass(frozen=True)
class CompiledRule:
    """One compiled rule. ``transition``: the rule reads ``oldSelf`` (runs on update only)."""

    rule: str
    transition: bool
    native: NativeCheck | None
    program: Callable[[dict[str, Any]], Any] | None
    compile_error: str = ""
    # ``self == oldSelf``: JSON equality is CEL's equality on JSON values, so the native
    # answer is the answer both ways (no CEL run, no type-mismatch evaluation errors).
    exact: bool = False
    # The same program as closures (None where a node is left to the interpreter): a bool from
    # them is the verdict; anything else is answered by ``program``.
    closures: Callable[[dict[str, Any]], Any] | None = None
    # What the rule reads of ``self`` (``cel_closures.self_need``; None: all of it): the closures
    # get ``self`` converted that far only.
    need: Any = None

    def holds(self, value: Any, old: Any = None) -> bool:
        """Whether the rule holds for ``self``=value (and ``oldSelf``=old for transition rules).

        Raises ``CelError`` when the rule cannot be evaluated (the API server reports that as
        ``rule evaluation error``; a rule that did not compile is reported the same way).
        """
        if self.native is not None:
            verdict = self.native(value, old)
            if verdict or self.exact:
                return verdict
        if self.program is None:
            raise CelError(self.compile_error or "CEL is not available")
        to_cel = _json_to_cel()  # the program exists, so celpy is importable
        if self.closures is not None:
            try:
                fast = {"self": to_cel(value) if self.need is None else _projected(value, self.need, to_cel)}
                if self.transition:
                    fast["oldSelf"] = to_cel(old)
                result = self.closures(fast)
            except Exception:  # noqa: BLE001 - the full conversion and the interpreter below give the error
                result = None
            if type(result) is _bool_type():
                return bool(result)
        try:
            activation = {"self": to_cel(value)}
            if self.transition:
                activation["oldSelf"] = to_cel(old)
        except (ValueError, OverflowError) as err:  # e.g. an integer beyond CEL's int64: "overflow"
            raise CelError(f"the value cannot be a CEL value: {err}") from err
        try:
            return bool(self.program(activation))
        except Exception as err:  # noqa: BLE001 - cel-python raises several types for one meaning
            if "overload" in str(err):
                # cel-python has no heterogeneous equality (``0 in ['auto']`` is an overload
                # error there, false in cel-go), and an int-or-string value compared with the
                # other type is a mismatch of the value, not of the rule: the rule fails with its
                # own message (docs/compatibility.md).
                return False
            raise CelError(str(err)) from err


# cel-python builds its LALR parser from the CEL grammar on first use: about 0.3 s of CPU in every
# process that compiles a rule (each planner replica, each devcluster). The built tables are kept
# in a private per-user folder and later processes load them (tens of ms).
PARSER_CACHE_DIR = Path(tempfile.gettempdir()) / f"trainyard-cel-parser-{os.getuid()}"


def cel_environment() -> Any:
    """A cel-python Environment, its shared parser loaded from the cache when it can be."""
    import celpy
    from celpy.celparser import CELParser

    if CELParser.CEL_PARSER is None:
        CELParser.CEL_PARSER = _cached_parser(CELParser)
    return celpy.Environment()


def _private_dir(path: Path) -> bool:
    """``path`` exists as a folder only this user can write (a pickle is loaded from it)."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _cached_parser(parser_class: Any) -> Any:
    import celpy
    import lark

    grammar = (Path(celpy.__file__).parent / "cel.lark").read_text()
    # The same options cel-python gives its parser (celpy.celparser.CELParser.__init__).
    options = dict(parser="lalr", start="expr", debug=True, g_regex_flags=re.M,
                   lexer_callbacks={"IDENT": parser_class.ambiguous_literals}, propagate_positions=True,
                   maybe_placeholders=False, priority="invert", tree_class=lark.Tree)
    if not _private_dir(PARSER_CACHE_DIR):
        return lark.Lark(grammar, **options)
    from importlib.metadata import version

    built_by = f"{version('cel-python')} {lark.__version__} {sys.version_info[:2]}"
    key = hashlib.sha256(f"{grammar}{built_by}".encode()).hexdigest()[:16]
    final = PARSER_CACHE_DIR / f"cel-{key}.lark"
    try:
        with final.open("rb") as cached:
            return lark.Lark.load(cached)
    except Exception:  # noqa: BLE001 - no cache yet, or an unreadable one: build it (and write it anew)
        pass
    parser = lark.Lark(grammar, **options)
    # Written beside and renamed into place, so no process ever reads a half-written cache.
    partial = PARSER_CACHE_DIR / f".cel-{key}.{os.getpid()}.partial"
    try:
        with partial.open("wb") as out:
            parser.save(out)
        os.replace(partial, final)
    except Exception:  # noqa: BLE001 - a parser that cannot be cached is still a parser
        partial.unlink(missing_ok=True)
    return parser


@lru_cache(maxsize=1024)
def compile_rule(rule: str) -> CompiledRule:
    """Compile ``rule`` once; later calls with the same text return the same object."""
    transition = bool(_OLD_SELF.search(rule))
    if _SELF_EQ_OLD.match(rule):
        return CompiledRule(rule, True, lambda v, old: bool(v == old), None, exact=True)
    native = _native_check(rule)
    try:
        import celpy
    except ImportError:  # pragma: no cover - cel-python is a declared dependency
        return CompiledRule(rule, transition, native, None, "cel-python is not installed")
    from trainyard.apimachinery.cel_library import FUNCTIONS  # CRD rules get Kubernetes' libraries too
    from trainyard.apimachinery.cel_closures import compile_tree, self_need
    env = cel_environment()
    try:
        tree = env.compile(rule)
        program = env.program(tree, functions=FUNCTIONS).evaluate
    except Exception as err:  # noqa: BLE001 - a bad rule is reported where it is evaluated
        return CompiledRule(rule, transition, native, None, str(err))
    closures = compile_tree(tree, FUNCTIONS, eager_logic=True)
    return CompiledRule(rule, transition, native, program, closures=closures,
                        need=self_need(tree) if closures is not None else None)


def _projected(value: Any, need: Any, to_cel: Callable[[Any], Any]) -> Any:
    """``value`` as a CEL value as far as ``need`` (a ``cel_closures.Need``) reads it: a map
    holds only the fields read (a field only tested by ``has()`` holds an empty map), a list
    iterated by a macro holds its items so narrowed; anything else is converted whole. A field
    left out must still be a CEL value (an integer beyond int64 is not): when one is not, the
    whole value is converted, so the conversion fails as it always did."""
    if need.full:
        return to_cel(value)
    kind = type(value)
    if kind is dict and need.items is None:
        from celpy import celtypes
        out = celtypes.MapType()
        fields = need.fields
        for key, item in value.items():
            if type(key) is not str:
                return to_cel(value)
            sub = fields.get(key)
            if sub is not None:
                out[celtypes.StringType(key)] = _projected(item, sub, to_cel)
            elif not _convertible(item):
                return to_cel(value)
        return out
    if kind is list and need.items is not None and not need.fields:
        from celpy import celtypes
        return celtypes.ListType([_projected(item, need.items, to_cel) for item in value])
    return to_cel(value)


def _convertible(value: Any) -> bool:
    """Whether ``value`` is plain JSON that ``json_to_cel`` converts without an error (string
    keys, integers within int64); False only means "not known to be"."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str or kind is bool or kind is float or item is None:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is not int or not -(2 ** 63) <= item < 2 ** 63:
            return False
    return True


@lru_cache(maxsize=1)
def _bool_type() -> type:
    from celpy import celtypes
    return celtypes.BoolType


# --- native checks ------------------------------------------------------------------------

def _strings(listed: str) -> frozenset[str]:
    return frozenset(re.findall(r"'([^']*)'", listed))


def _has(value: Any, path: str) -> bool:
    current = value
    for part in path.strip(".").split("."):
        if not isinstance(current, dict) or part not in current:
            return False
        current = current[part]
    return True


def _has_expression(rule: str) -> Callable[[Any], bool] | None:
    """Rules made only of ``has(self.a.b)``, ``!``, ``&&``, ``||`` and parentheses."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = rule.strip()
    while pos < len(text):
        m = _HAS_TOKEN.match(text, pos)
        if not m:
            return None
        tokens.append(("has", m.group(2)) if m.group(2) else (m.group(1), ""))
        pos = m.end()
    index = [0]

    def peek() -> str | None:
        return tokens[index[0]][0] if index[0] < len(tokens) else None

    def parse_or() -> Callable[[Any], bool]:
        left = parse_and()
        while peek() == "||":
            index[0] += 1
            right, first = parse_and(), left
            left = (lambda a, b: lambda v: a(v) or b(v))(first, right)
        return left

    def parse_and() -> Callable[[Any], bool]:
        left = parse_not()
        while peek() == "&&":
            index[0] += 1
            right, first = parse_not(), left
            left = (lambda a, b: lambda v: a(v) and b(v))(first, right)
        return left

    def parse_not() -> Callable[[Any], bool]:
        if peek() == "!":
            index[0] += 1
            inner = parse_not()
            return lambda v: not inner(v)
        if peek() == "(":
            index[0] += 1
            inner = parse_or()
            if peek() != ")":
                raise ValueError("unbalanced")
            index[0] += 1
            return inner
        if peek() == "has":
            path = tokens[index[0]][1]
            index[0] += 1
            return lambda v: _has(v, path)
        raise ValueError("unexpected token")
    try:
        compiled = parse_or()
    except (ValueError, IndexError):
        return None
    return compiled if index[0] == len(tokens) else None


def _conjuncts(text: str) -> list[str] | None:
    """``text`` split at its top-level ``&&`` (outside parentheses, brackets and quotes); None
    when it has a top-level ``||`` or ``?`` (then the split would not be its structure)."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and text.startswith("&&", i):
            parts.append(text[start:i])
            start, i = i + 2, i + 2
            continue
        elif depth == 0 and (text.startswith("||", i) or char == "?"):
            return None
        i += 1
    if depth or quote:
        return None
    parts.append(text[start:])
    return parts


def _field_at(value: Any, path: str) -> tuple[bool, Any]:
    """(True, the value at ``.a.b`` under ``value``) when every map on the way is there;
    (False, None) when a step is not a map or a key before the last is missing."""
    parts = path.strip(".").split(".")
    current = value
    for part in parts[:-1]:
        if not isinstance(current, dict) or part not in current:
            return False, None
        current = current[part]
    if not isinstance(current, dict):
        return False, None
    return True, current.get(parts[-1], _ABSENT)


_ABSENT = object()


def _negated_conjunction(rule: str) -> Callable[[Any], bool] | None:
    """Rules shaped ``!(A && B && ...)`` where some terms are ``has(self.a.b)`` or
    ``self.a.b == 'text'`` (the others may be anything, e.g. a macro): the rule certainly
    holds when one of those terms is certainly false (``has`` of a key absent from a map that
    is there; a string field that is there with another text), since CEL's ``&&`` is false
    when any operand is false, whatever the others give (errors included). JobSet's
    "StartupPolicy and DependsOn APIs are mutually exclusive" rule runs on every JobSet
    write, and its CEL evaluation was about a tenth of a create's CPU."""
    text = rule.strip()
    if not text.startswith("!") or not text[1:].lstrip().startswith("("):
        return None
    inner = text[1:].lstrip()
    terms = _conjuncts(inner[1:-1]) if inner.endswith(")") else None
    if terms is None or _conjuncts(inner) != [inner]:  # the parentheses must enclose it all
        return None
    checks: list[Callable[[Any], bool]] = []  # each: True when its term is certainly false
    for term in terms:
        m = _HAS_TERM.match(term)
        if m:
            checks.append(lambda v, path=m.group(1): _field_at(v, path) == (True, _ABSENT))
            continue
        m = _EQUALS_STRING_TERM.match(term)
        if m:
            checks.append(lambda v, path=m.group(1), text=m.group(2): _string_other_than(_field_at(v, path), text))
    if not checks:
        return None
    return lambda v: any(check(v) for check in checks)


def _string_other_than(found: tuple[bool, Any], text: str) -> bool:
    there, value = found
    return there and isinstance(value, str) and value != text


def _native_check(rule: str) -> NativeCheck | None:
    """A native check for the rule shapes of the generated CRDs; None for any other rule."""
    m = _NAME_MATCHES.match(rule)
    if m:
        pattern = re.compile(m.group(1))
        return lambda v, _old: isinstance(v, dict) and isinstance(v.get("metadata"), dict) and \
            isinstance(v["metadata"].get("name"), str) and bool(pattern.search(v["metadata"]["name"]))
    m = _NAME_SIZE.match(rule)
    if m:
        limit = int(m.group(1))
        return lambda v, _old: isinstance(v, dict) and isinstance(v.get("metadata"), dict) and \
            isinstance(v["metadata"].get("name"), str) and len(v["metadata"]["name"]) <= limit
    m = _IN_LIST.match(rule)
    if m:
        allowed = _strings(m.group(1))
        return lambda v, _old: isinstance(v, str) and v in allowed
    m = _POSITIVE_OR_IN_LIST.match(rule)
    if m:
        allowed = _strings(m.group(1))
        return lambda v, _old: (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) or \
            (isinstance(v, str) and v in allowed)
    has = _has_expression(rule)
    if has is not None:
        return lambda v, _old: has(v)
    certainly_false_term = _negated_conjunction(rule)
    return (lambda v, _old: certainly_false_term(v)) if certainly_false_term is not None else None


# --- expressions with the Kubernetes environment (ValidatingAdmissionPolicy) ----------------

_IN_ACTIVATION = re.compile(r"\s*\(in activation '.*$", re.S)
_NO_MEMBER = re.compile(r"^no such member in mapping: '([^']*)'$")


def error_text(err: BaseException) -> str:
    """One line for a cel-python error, worded as cel-go words the common ones."""
    text = str(err.args[0]) if getattr(err, "args", None) else str(err)
    text = _IN_ACTIVATION.sub("", text)
    m = _NO_MEMBER.match(text)
    if m:
        return f"no such key: {m.group(1)}"
    if text.startswith("undeclared reference to "):
        return text
    if text == "no such overload" and len(getattr(err, "args", ())) > 2 and err.args[2]:
        return f"no such overload: {err.args[2][0]}" if isinstance(err.args[2], tuple) else text
    return text.splitlines()[0] if text else type(err).__name__


@dataclass(frozen=True)
class CompiledExpression:
    """One compiled CEL expression with the Kubernetes libraries (``cel_library``).

    ``compile_error`` is set (and ``program`` None) when the text does not compile; callers
    report it where the expression is evaluated (a policy's failurePolicy decides).
    """

    expression: str
    program: Callable[[dict[str, Any]], Any] | None
    compile_error: str = ""

    def evaluate(self, activation: dict[str, Any]) -> Any:
        """The CEL value of the expression; ``activation`` maps names to JSON values or to CEL
        values (``cel_value`` / ``LazyMap``). Raises ``CelError`` with a one-line message."""
        if self.program is None:
            raise CelError(f"compilation failed: {self.compile_error}")
        try:
            result = self.program(activation)
        except CelError:
            raise
        except Exception as err:  # noqa: BLE001 - cel-python raises several types for one meaning
            raise CelError(error_text(err)) from err
        if type(result).__name__ == "CELEvalError":
            raise CelError(error_text(result))
        return result


@lru_cache(maxsize=4096)
def compile_expression(expression: str) -> CompiledExpression:
    """Compile ``expression`` once per text, with the Kubernetes CEL libraries available."""
    try:
        import celpy
        from trainyard.apimachinery.cel_library import FUNCTIONS
    except ImportError:  # pragma: no cover - cel-python is a declared dependency
        return CompiledExpression(expression, None, "cel-python is not installed")
    from trainyard.apimachinery.cel_closures import compile_tree
    env = cel_environment()
    try:
        tree = env.compile(expression)
        program = env.program(tree, functions=FUNCTIONS).evaluate
    except Exception as err:  # noqa: BLE001 - reported where it is evaluated
        return CompiledExpression(expression, None, " ".join(str(err).split()))
    # The same evaluation as closures (cel_closures), where every node of the text allows it.
    closures = compile_tree(tree, FUNCTIONS)
    return CompiledExpression(expression, closures or program)


def cel_value(value: Any) -> Any:
    """A JSON value as a CEL value (maps, lists, strings, numbers, null)."""
    return _json_to_cel()(value)


@lru_cache(maxsize=1)
def _json_to_cel() -> Callable[[Any], Any]:
    """cel-python's ``json_to_cel``, the same values and errors, at a fraction of the cost: the
    JSON types are told apart by ``type(...) is`` (it tests ``isinstance`` against ``typing``
    generics, most of a rule's cost); anything else goes to ``json_to_cel`` itself."""
    from celpy import celtypes, json_to_cel

    string, integer, double, boolean = celtypes.StringType, celtypes.IntType, celtypes.DoubleType, celtypes.BoolType
    map_type, list_type = celtypes.MapType, celtypes.ListType
    new_int = int.__new__

    def convert(value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return string(value)
        if kind is dict:
            out = map_type()
            for key, item in value.items():
                out[string(key) if type(key) is str else convert(key)] = convert(item)
            return out
        if kind is list:
            return list_type([convert(item) for item in value])
        if kind is int:
            # IntType(value) for an int64: the same object without its per-call range wrapper
            return new_int(integer, value) if -(2 ** 63) <= value < 2 ** 63 else integer(value)
        if kind is bool:
            return boolean(value)
        if kind is float:
            return double(value)
        if value is None:
            return None
        return json_to_cel(value)
    return convert


def lazy_map(resolve: Callable[[str], Any], names: list[str]) -> Any:
    """A CEL map whose entries are computed on first access (a policy's ``variables``):
    ``resolve(name)`` returns the entry's CEL value or raises ``CelError``; the error becomes
    the expression's error only when the entry is read."""
    return _lazy_map_type()(resolve, names)


@lru_cache(maxsize=1)
def _lazy_map_type() -> type:
    from celpy import celtypes
    from celpy.evaluation import CELEvalError

    class LazyMap(celtypes.MapType):
        def __init__(self, resolve: Callable[[str], Any], names: list[str]) -> None:
            super().__init__({celtypes.StringType(n): None for n in names})
            self._resolve = resolve
            self._names = frozenset(names)
            self._done: dict[str, Any] = {}

        def __getitem__(self, key: Any) -> Any:
            name = str(key)
            if name not in self._names:
                raise KeyError(key)
            if name not in self._done:
                try:
                    self._done[name] = self._resolve(name)
                except CelError as err:
                    self._done[name] = CELEvalError(str(err))
            return self._done[name]

    return LazyMap


def as_bool(value: Any) -> bool | None:
    """A CEL result as a Python bool; None when it is not a CEL bool."""
    from celpy import celtypes
    return bool(value) if isinstance(value, celtypes.BoolType) else None
