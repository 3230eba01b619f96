"""Load the Lua scripts: ``prelude.lua`` + one file per operation.

In a wheel the scripts are inside the package (``allocator/lua/``, put there by
hatchling's force-include); in a source checkout or an editable install they
are only in the repository's top-level ``lua/``, so that is the fallback.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["OPERATIONS", "Scripts", "load_scripts", "lua_dir", "scripts"]

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
    "leases",
    "stats",
    "quarantine",
    "delete",
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


class Scripts:
    """The pool scripts by operation: their text and SHA1.

    The shells call ``EVALSHA`` directly and load a script when the server
    answers NOSCRIPT (a restart, SCRIPT FLUSH, a new cluster node): redis-py's
    ``Script`` wrapper does the same, at about a third more client CPU per
    call.
    """

    def __init__(self) -> None:
        self.text = load_scripts()
        self.sha = {op: hashlib.sha1(t.encode("utf-8")).hexdigest() for op, t in self.text.items()}


_SCRIPTS: list[Scripts] = []


def scripts() -> Scripts:
    """The scripts, read from disk once per process."""
    if not _SCRIPTS:
        _SCRIPTS.append(Scripts())
    return _SCRIPTS[0]
