"""The names of a pool's keys (the schema is in lua/README.md): escaping a
name into one cluster hash tag, the ACL pattern of a pool, finding pools."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .checks import MAX_NAME, _text
from .replies import _decode

KEY_SUFFIXES = (
    "meta", "res", "gone", "free", "park", "q", "recs", "exp", "bind", "bexp", "alive", "rlog",
    "pick", "held", "stats", "events",
)  # fmt: skip


#: Positions in Pool.keys.
PICK = KEY_SUFFIXES.index("pick")


def _escape(text: str) -> str:
    # Braces would break (or move) the cluster hash tag; % keeps it reversible.
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _glob_escape(text: str) -> str:
    # Redis glob patterns (ACL key patterns, SCAN MATCH): \ first, then the
    # characters that would match more than themselves.
    for char in "\\*?[]":
        text = text.replace(char, "\\" + char)
    return text


def acl_key_pattern(name: str, prefix: str = "alloc") -> str:
    """The ACL key pattern that covers the keys of pool `name` (under
    `prefix`) and of no other pool: `alloc:{name}:*`, the name escaped as
    the keys escape it, and the glob characters `* ? [ ] \\` escaped, so
    that no name can widen it. `acl_key_pattern("proxies")` is
    `alloc:{proxies}:*`. Use it after `~` in `ACL SETUSER`
    ([operations](operations.md#acl))."""
    name = _text("name", name, MAX_NAME)
    prefix = _text("prefix", prefix, MAX_NAME)
    return _glob_escape(f"{_escape(prefix)}:{{{_escape(name)}}}") + ":*"


def pools_pattern(prefix: object) -> str:
    """The SCAN pattern that finds the keys of every pool under ``prefix``
    (glob characters of the prefix escaped, so that it matches no other
    prefix). Any key of a pool tells that it exists: a pool may have a
    queue and no resources yet, or resources and no bookkeeping yet."""
    prefix = _text("prefix", prefix, MAX_NAME)
    return _glob_escape(_escape(prefix)) + ":{*}:*"


_UNESCAPE = {"%25": "%", "%7B": "{", "%7D": "}"}


def pool_names(keys: Iterable[Any], prefix: str) -> list[str]:
    """The pool names in ``keys`` (SCAN replies for :func:`pools_pattern`),
    unescaped, each once, sorted. Signal lists and keys of other shapes are
    not a pool's keys."""
    head = _escape(prefix) + ":{"
    names = set()
    for key in keys:
        text = _decode(key)
        if not text.startswith(head):
            continue
        middle, brace, suffix = text[len(head) :].partition("}:")
        if brace and suffix in KEY_SUFFIXES and "{" not in middle:
            names.add(re.sub("%(25|7B|7D)", lambda m: _UNESCAPE[m.group(0)], middle))
    return sorted(names)
