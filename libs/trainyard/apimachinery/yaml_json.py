"""YAML read as the API server and kubectl read it: as JSON values (sigs.k8s.io/yaml).

Used by devcluster for YAML request bodies and apply configurations, and by the CLI for the
files it reads. A timestamp stays the string it is written as; tags whose values JSON cannot
hold (binary, sets, ordered pairs) are refused; and aliases may not expand a document far beyond
its size (go-yaml's "excessive aliasing"), so an alias bomb is refused before anything walks it.
"""
from __future__ import annotations

from typing import Any, Iterator

import yaml


class YamlJsonError(ValueError):
    """A YAML document with no JSON form; the message is one line, ``mark`` where known."""

    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


class JsonYamlLoader(yaml.SafeLoader):
    """SafeLoader with the API server's view of timestamps and of tags without a JSON value."""


def _as_text(loader: JsonYamlLoader, node: yaml.Node) -> str:
    return loader.construct_scalar(node)


def _refused(loader: JsonYamlLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(None, None, f"the YAML tag {node.tag} has no JSON value",
                                            node.start_mark)


JsonYamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    JsonYamlLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refused)


def expanded_size(value: Any, limit: int) -> int:
    """How many values the document holds once its aliases are expanded, counting a shared node
    once per reference (memoised, so an alias bomb is measured without expanding it); stops
    counting past ``limit``; -1 for a document that contains itself."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise RecursionError
        active.add(key)
        total = 1
        for child in (node.values() if isinstance(node, dict) else node):
            total += size(child)
            if total > limit:
                break
        active.discard(key)
        sizes[key] = total
        return total
    try:
        return size(value)
    except RecursionError:
        return -1


def check_aliases(value: Any, text: str) -> None:
    """Refuses a document whose aliases expand it beyond 4 values per byte of its text."""
    if "&" not in text or "*" not in text:
        return
    limit = 4 * len(text) + 10_000
    expanded = expanded_size(value, limit)
    if expanded < 0:
        raise YamlJsonError("the document contains itself through an alias")
    if expanded > limit:
        raise YamlJsonError("document contains excessive aliasing")


def load_all(text: str) -> Iterator[Any]:
    """The documents of a YAML stream; :class:`YamlJsonError` (or ``yaml.YAMLError``) for one
    that JSON cannot hold."""
    documents = yaml.load_all(text, Loader=JsonYamlLoader)  # noqa: S506 - a SafeLoader subclass
    while True:
        try:
            document = next(documents)
        except StopIteration:
            return
        except (YamlJsonError, yaml.YAMLError):
            raise
        except ValueError as err:  # a constructor's own refusal, e.g. an integer of 5000 digits
            raise YamlJsonError(str(err).split(";")[0]) from None
        check_aliases(document, text)
        yield document


def load(text: str) -> Any:
    """One YAML document (a stream of several is a ``yaml.YAMLError``)."""
    try:
        value = yaml.load(text, Loader=JsonYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except (YamlJsonError, yaml.YAMLError):
        raise
    except ValueError as err:  # a constructor's own refusal, e.g. an integer of 5000 digits
        raise YamlJsonError(str(err).split(";")[0]) from None
    check_aliases(value, text)
    return value
