"""The Kubernetes CEL libraries of the one evaluator, value by value, as the Kubernetes CEL
documentation shows them (strings, lists, regex, quantity, URL), plus how errors read."""
from __future__ import annotations

import pytest

from trainyard.apimachinery.cel import CelError, cel_value, compile_expression, lazy_map


def run(expression: str, **names):
    return compile_expression(expression).evaluate({k: cel_value(v) for k, v in names.items()})


@pytest.mark.parametrize("expression", [
    # strings
    "'hello'.charAt(1) == 'e'",
    "'hello mellow'.indexOf('ello') == 1 && 'hello mellow'.indexOf('ello', 2) == 7",
    "'hello mellow'.lastIndexOf('ello') == 7",
    "'TacoCat'.lowerAscii() == 'tacocat' && 'TacoCat'.upperAscii() == 'TACOCAT'",
    "'hello hello'.replace('he', 'we') == 'wello wello' && 'hello hello'.replace('he', 'we', 1) == 'wello hello'",
    "'a,b,c'.split(',') == ['a', 'b', 'c'] && 'a,b,c'.split(',', 2) == ['a', 'b,c']",
    "'tacocat'.substring(4) == 'cat' && 'tacocat'.substring(0, 4) == 'taco'",
    "'  trim  '.trim() == 'trim'",
    "['a', 'b'].join() == 'ab' && ['a', 'b'].join(', ') == 'a, b'",
    # lists
    "[1, 2, 3].isSorted() && !['b', 'a'].isSorted()",
    "[1, 2, 3].sum() == 6 && [].sum() == 0",
    "[1, 5, 3].min() == 1 && [1, 5, 3].max() == 5",
    "[1, 2, 2, 3].indexOf(2) == 1 && [1, 2, 2, 3].lastIndexOf(2) == 2 && [1].indexOf(9) == -1",
    # regex
    "'abc 123'.find('[0-9]+') == '123' && 'abc'.find('[0-9]+') == ''",
    "'123 abc 456'.findAll('[0-9]+') == ['123', '456'] && '123 abc 456'.findAll('[0-9]+', 1) == ['123']",
    # quantity
    "isQuantity('1.3G') && !isQuantity('1.3Gi ')",
    "quantity('1Gi').isGreaterThan(quantity('1000Mi')) && quantity('50M').isLessThan(quantity('100M'))",
    "quantity('50k').compareTo(quantity('50000')) == 0",
    "quantity('1.5').add(quantity('0.5')) == quantity('2') && quantity('5').sub(3) == quantity('2')",
    "quantity('50k').asInteger() == 50000 && quantity('50m').isInteger() == false",
    "quantity('-3').sign() == -1 && quantity('0').sign() == 0",
    "quantity('1.5').asApproximateFloat() == 1.5",
    # URL
    "isURL('https://example.com:8080/path?query=val') && !isURL('not a url')",
    "url('https://example.com:8080/path').getScheme() == 'https'",
    "url('https://user@example.com:8080/path').getHost() == 'example.com:8080'",
    "url('https://[::1]:80/').getHostname() == '::1' && url('https://example.com/').getPort() == ''",
    "url('https://example.com/a%20b').getEscapedPath() == '/a%20b'",
    "url('https://example.com/?k=a&k=b').getQuery() == {'k': ['a', 'b']}",
    # IP and CIDR
    "isIP('10.0.0.1') && isIP('::1') && !isIP('1.2.3') && !isIP('fe80::1%eth0')",
    "ip('10.0.0.1').family() == 4 && ip('::1').family() == 6 && string(ip('10.0.0.1')) == '10.0.0.1'",
    "ip('127.0.0.1').isLoopback() && ip('0.0.0.0').isUnspecified() && ip('8.8.8.8').isGlobalUnicast()",
    "ip('fe80::1').isLinkLocalUnicast() && ip('224.0.0.1').isLinkLocalMulticast()",
    "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3')) && !cidr('10.0.0.0/8').containsIP('11.0.0.1')",
    "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16') && !cidr('10.1.0.0/16').containsCIDR('10.0.0.0/8')",
    "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8') && cidr('10.1.2.3/8').ip() == ip('10.1.2.3')",
    "cidr('10.0.0.0/8').prefixLength() == 8 && isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0')",
])
def test_library_functions(expression):
    assert run(expression) is not None and bool(run(expression)) is True


@pytest.mark.parametrize("expression,names,message", [
    ("object.spec.missing", {"object": {"spec": {}}}, "no such key: missing"),
    ("nothing.here", {}, "undeclared reference to 'nothing'"),
    ("[].max()", {}, "max called on empty list"),
    ("quantity('12 apples')", {}, "quantities must match the regular expression"),
    ("url('nope')", {}, "URL parse error during conversion from string: nope"),
    ("'abc'.substring(5)", {}, "index out of range: 5"),
    ("ip('::ffff:1.2.3.4')", {}, "IPv4-mapped IPv6 address is not allowed"),
])
def test_errors_read_as_one_line(expression, names, message):
    with pytest.raises(CelError) as err:
        run(expression, **names)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and "activation" not in str(err.value)


def test_a_text_that_does_not_compile_fails_where_it_is_evaluated():
    compiled = compile_expression("object.(")
    assert compiled.program is None
    with pytest.raises(CelError) as err:
        compiled.evaluate({})
    assert str(err.value).startswith("compilation failed: ")
    assert compile_expression("object.(") is compiled  # compiled once per text


def test_lazy_map_evaluates_an_entry_on_first_read_only():
    calls = []

    def resolve(name):
        calls.append(name)
        if name == "bad":
            raise CelError("boom")
        return cel_value(41)

    variables = lazy_map(resolve, ["good", "bad"])
    expression = compile_expression("variables.good + 1 == 42 && variables.good == 41")
    assert bool(expression.evaluate({"variables": variables})) is True
    assert calls == ["good"]
    with pytest.raises(CelError, match="boom"):
        compile_expression("variables.bad == 1").evaluate({"variables": variables})


def test_crd_rules_get_the_same_libraries():
    from trainyard.apimachinery.cel import compile_rule
    rule = compile_rule("quantity(self.memory).isLessThan(quantity('1Gi')) && self.name.lowerAscii() == self.name")
    assert rule.holds({"memory": "512Mi", "name": "abc"}) is True
    assert rule.holds({"memory": "2Gi", "name": "abc"}) is False
