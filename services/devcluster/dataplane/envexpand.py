"""Kubernetes ``$(VAR)`` expansion, as applied to env values, ``command`` and ``args``.

``$(NAME)`` becomes the value of NAME when it is defined and stays verbatim otherwise;
``$$`` becomes a single ``$`` (so ``$$(NAME)`` yields the literal ``$(NAME)``); any other
``$`` is kept. No shell is involved.
"""
from __future__ import annotations

from typing import Mapping


def expand(text: str, variables: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        char = text[i]
        if char != "$" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        follower = text[i + 1]
        if follower == "$":
            out.append("$")
            i += 2
            continue
        if follower == "(":
            end = text.find(")", i + 2)
            if end != -1:
                name = text[i + 2:end]
                out.append(variables[name] if name in variables else text[i:end + 1])
                i = end + 1
                continue
        out.append(char)
        i += 1
    return "".join(out)
