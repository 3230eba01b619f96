"""Load the Lua scripts: ``prelude.lua`` + one file per operation.

In a wheel the scripts are inside the package (``allocator/lua/``, put there by
hatchling's force-include); in a source checkout or an editable install they
are only in the repository's top-level ``lua/``, so that is the fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["OPERATIONS", "load_scripts", "lua_dir", "register"]

OPERATIONS = (
    "acquire",
    "poll",
    "cancel",
    "release",
    "renew",
    "extend",
    "remove",
    "bind",
    "unbind",
    "status",
    "gc",
)


def lua_dir() -> Path:
    """The directory the scripts are read from."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "prelude.lua").is_file():
            return candidate
    raise FileNotFoundError(
        f"allocator's Lua scripts are missing: neither {here / 'lua'} nor {here.parent / 'lua'} "
        "holds prelude.lua (a broken install?)"
    )


def load_scripts() -> dict[str, str]:
    """Script text per operation, each with the prelude in front."""
    folder = lua_dir()
    prelude = (folder / "prelude.lua").read_text(encoding="utf-8")
    return {
        op: prelude + "\n" + (folder / f"{op}.lua").read_text(encoding="utf-8") for op in OPERATIONS
    }


_TEXTS: dict[str, str] = {}


def register(client: Any) -> dict[str, Any]:
    """The scripts registered on ``client`` (no I/O: redis-py sends EVALSHA
    and loads a script on NOSCRIPT by itself, in pipelines too)."""
    if not _TEXTS:
        _TEXTS.update(load_scripts())
    return {op: client.register_script(text) for op, text in _TEXTS.items()}
