"""cel-python's parser is built once per user and loaded by later processes (issue #33: the
first rule of a fresh planner or devcluster cost 0.4 s of CPU, most of it building the CEL
grammar's LALR tables). A loaded parser must parse exactly as a built one, and a cache that
someone else could have written is never loaded (it is a pickle)."""
from __future__ import annotations

import lark
import pytest
from celpy.celparser import CELParser

from trainyard.apimachinery import cel

from .test_crd_rules_closures import shipped_rules


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cel-parser"
    monkeypatch.setattr(cel, "PARSER_CACHE_DIR", directory)
    monkeypatch.setattr(CELParser, "CEL_PARSER", None)  # restored after the test
    return directory


def trees(parser: lark.Lark, rules: list[str]) -> list[lark.Tree]:
    return [parser.parse(rule) for rule in rules]


def test_a_loaded_parser_parses_every_shipped_rule_as_a_built_one(cache_dir, monkeypatch) -> None:
    built = cel._cached_parser(CELParser)
    [cached] = cache_dir.glob("cel-*.lark")
    assert cache_dir.stat().st_mode & 0o777 == 0o700
    assert not list(cache_dir.glob(".*partial"))

    def no_building(*_args, **_kwargs):
        raise AssertionError("the parser was built again instead of loaded")

    monkeypatch.setattr(lark.Lark, "__init__", no_building)
    loaded = cel._cached_parser(CELParser)
    rules = shipped_rules()
    assert len(rules) >= 10
    assert trees(loaded, rules) == trees(built, rules)
    # the lexer callback survives the cache: true/false are literals, not identifiers
    assert trees(loaded, ["self.a == true || false"]) == trees(built, ["self.a == true || false"])
    assert cached.exists()


def test_compiled_rules_use_the_cached_parser_and_still_evaluate(cache_dir) -> None:
    cel.compile_rule.cache_clear()
    try:
        rule = cel.compile_rule("self.minAvailable <= self.replicas || self.replicas == 0")
        assert rule.holds({"minAvailable": 1, "replicas": 2})
        assert not rule.holds({"minAvailable": 3, "replicas": 2})
        assert list(cache_dir.glob("cel-*.lark"))
    finally:
        cel.compile_rule.cache_clear()


def test_a_cache_folder_others_can_write_is_never_loaded(cache_dir, monkeypatch) -> None:
    cel._cached_parser(CELParser)
    [cached] = cache_dir.glob("cel-*.lark")
    cached.write_bytes(b"not a parser")  # as if planted
    cache_dir.chmod(0o777)
    loads = []
    monkeypatch.setattr(lark.Lark, "load", classmethod(lambda cls, f: loads.append(f)))
    parser = cel._cached_parser(CELParser)
    assert loads == []
    assert parser.parse("self.x > 1").data == "expr"


def test_a_corrupt_cache_is_rebuilt(cache_dir) -> None:
    cel._cached_parser(CELParser)
    [cached] = cache_dir.glob("cel-*.lark")
    cached.write_bytes(b"\x80\x04 half a pickle")
    parser = cel._cached_parser(CELParser)
    assert parser.parse("self.x > 1").data == "expr"
    assert lark.Lark.load(cached.open("rb")).parse("self.x > 1") == parser.parse("self.x > 1")
