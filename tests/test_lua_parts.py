"""The layout of lua/: the prelude is several files joined in one order
(allocator/_scripts.py ``PRELUDE``, lua/README.md "The prelude"), and no
file grows past what one can read."""

from __future__ import annotations

import re
from pathlib import Path

from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import (
    CALL_MARK,
    HELPERS_MARK,
    OPERATIONS,
    PRELUDE,
    load_scripts,
    prelude_text,
)

LUA = Path(__file__).resolve().parent.parent / "lua"

#: A helper's definition: ``function P:name(`` or ``function P.name(``.
DEFINED = re.compile(r"^function P[:.]([A-Za-z_][A-Za-z_0-9]*)\(", re.MULTILINE)
#: A helper's use: ``P:name(``, ``self:name(``, ``P.name(`` or ``self.name(``.
CALLED = re.compile(r"\b(?:P|self)[:.]([A-Za-z_][A-Za-z_0-9]*)\(")


def part(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


def test_every_part_of_the_prelude_is_joined_once_in_its_order() -> None:
    assert len(set(PRELUDE)) == len(PRELUDE)
    assert set(PRELUDE) == {f.stem for f in LUA.glob("prelude_*.lua")}
    assert not (LUA / "prelude.lua").exists()
    texts = [part(name) for name in PRELUDE]
    joined = prelude_text()
    # One blank line between two parts and nothing else: each part keeps
    # its own last newline and the join adds one.
    assert joined == "\n".join(texts)
    for name, text in zip(PRELUDE, texts, strict=True):
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        assert text.strip(), name
    for op, script in load_scripts().items():
        assert script == joined + "\n" + part(op), op


def test_the_helpers_mark_splits_the_state_from_the_helpers() -> None:
    joined = prelude_text()
    assert joined.count(HELPERS_MARK) == 1
    # The state of a call comes first and defines no helper; the defaults
    # part starts with the mark, and every constant (P.NAME = ...) and
    # default is set there, before any helper that reads it.
    state, defaults = part(PRELUDE[0]), part(PRELUDE[1])
    assert HELPERS_MARK not in state and not DEFINED.search(state)
    # The state starts with the names of the keys, which the Functions
    # library keeps per pool: they read KEYS[1] and nothing of the call.
    assert joined.count(CALL_MARK) == 1
    names, _, call = state.partition(CALL_MARK)
    assert "KEYS[1]" in names and "redis.call(" not in names and "ARGV" not in names
    # The state of a call reads no key of its own, and no script reads a
    # key other than META (lua/README.md, "Keys").
    assert "KEYS" not in call and "KEYS[2]" not in joined
    assert defaults.startswith(HELPERS_MARK)
    for name in PRELUDE[2:]:
        assert not re.search(r"^P\.[A-Za-z_]+(?:, P\.[A-Za-z_]+)* = ", part(name), re.M), name


def test_every_helper_is_defined_once_and_every_one_called_is_defined() -> None:
    where: dict[str, str] = {}
    for name in PRELUDE:
        for helper in DEFINED.findall(part(name)):
            assert helper not in where, f"P:{helper} in {where.get(helper)} and {name}"
            where[helper] = name
    # The operations define no helper of their own, and call only those of
    # the prelude (a method of P, or a field set in the state or defaults).
    for op in OPERATIONS:
        assert not DEFINED.search(part(op)), op
    for f in sorted(LUA.glob("*.lua")):
        for helper in CALLED.findall(f.read_text(encoding="utf-8")):
            assert helper in where, f"{f.name} calls P:{helper}, which no part defines"


def test_no_lua_file_is_longer_than_600_lines() -> None:
    for f in sorted(LUA.glob("*.lua")):
        lines = f.read_text(encoding="utf-8").count("\n")
        assert lines <= 600, f"{f.name}: {lines} lines"


def test_the_scripts_name_the_keys_as_the_clients_do() -> None:
    """The scripts name every key of a pool from its META key, with the
    suffixes of allocator/_core/keys.py, in the same order."""
    suffixes = re.search(r"^P\.SUFFIXES = \{(.*?)\}", part("prelude_defaults"), re.M | re.S)
    assert suffixes is not None
    assert tuple(re.findall(r"'([a-z]+)'", suffixes.group(1))) == KEY_SUFFIXES
    state = part("prelude_state")
    for suffix in KEY_SUFFIXES:
        if suffix not in ("meta", "events", "tw", "tq", "tenants"):
            assert f"b .. '{suffix}'" in state, suffix
