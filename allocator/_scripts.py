"""Load the Lua scripts: the prelude (the files of :data:`PRELUDE`, joined in
that order) + one file per operation, and run them: as a Redis Functions
library where the server has one, else as scripts.

In a wheel the scripts are inside the package (``allocator/lua/``, put there by
hatchling's force-include); in a source checkout or an editable install they
are only in the repository's top-level ``lua/``, so that is the fallback.

**Two ways to run the same Lua.** As a script (``EVALSHA``, Redis 6.2,
fakeredis, a Redis Cluster), the prelude and the operation's body run on
every call, so every helper closure is made again on every call. As a
Functions library (``FUNCTION LOAD`` once, then ``FCALL``; Redis >= 7 and
Valkey), built from the same files: the prelude's helpers (below its
``@helpers`` line) are defined once when the library loads; a call only
builds its state table (its keys, the server time), which finds the helpers
through a metatable. :meth:`Scripts.invoke` chooses once per client and
follows the server: a library lost to a restart, a failover or ``FUNCTION
FLUSH`` is loaded again, and a server or a user (its ACL) without Functions
falls back to scripts for good. ``ALLOCATOR_FUNCTIONS=0`` in the environment
keeps every client on scripts.

**Reads write nothing.** The read-only operations (:data:`READ_ONLY`) never
load the library: with the library on the server they run with
``FCALL_RO``; without it they run as scripts, with ``EVALSHA_RO`` (Redis >=
7.0, Valkey: the server refuses any write in them) or, where the server
(Redis 6.2, fakeredis), the client (a Redis Cluster client) or the user's
ACL has no ``EVALSHA_RO``, with ``EVALSHA`` of the same read-only script. A
``NOSCRIPT`` is answered by ``EVAL_RO``/``EVAL`` of the text, as for any
script: the server then caches the script, which writes no key and is not
replicated. So a monitoring user reads a pool on a server where nobody
loaded the library, and ``status`` or ``watch`` changes nothing there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import weakref
from collections.abc import Generator
from pathlib import Path
from typing import Any

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from ._core.keys import KEY_SUFFIXES
from ._transport import client_kind, is_cluster

__all__ = [
    "OPERATIONS",
    "PRELUDE",
    "READ_ONLY",
    "Scripts",
    "library_text",
    "load_functions",
    "load_functions_async",
    "load_scripts",
    "lua_dir",
    "prelude_text",
    "scripts",
]

OPERATIONS = (
    "acquire",
    "acquire_many",
    "poll",
    "present",
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
    "unquarantine",
    "revoke",
    "set_events",
    "delete",
    "clients",
    "set_order",
    "set_weight",
    "tenants",
)


#: The files of the prelude (``lua/<name>.lua``), in the one order they are
#: joined in, for the scripts and the Functions library alike: the state of a
#: call first, then the ``@helpers`` line with the constants and defaults,
#: then the helpers by concern (lua/README.md, "The prelude").
PRELUDE = (
    "prelude_state",
    "prelude_defaults",
    "prelude_checks",
    "prelude_resources",
    "prelude_leases",
    "prelude_maintenance",
    "prelude_queue",
    "prelude_clients",
    "prelude_grant",
    "prelude_many",
    "prelude_tenants",
)


#: Operations that write nothing: registered with the ``no-writes`` flag in
#: the Functions library and called with ``FCALL_RO``, so that a monitoring
#: user whose ACL allows only ``FCALL_RO`` and read-only keys (``%R~``) can
#: run them, and so can a replica.
READ_ONLY = frozenset({"status", "leases", "stats", "clients", "tenants"})


def lua_dir() -> Path:
    """The directory the scripts are read from."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / f"{PRELUDE[0]}.lua").is_file():
            return candidate
    raise FileNotFoundError(
        f"allocator's Lua scripts are missing: neither {here / 'lua'} nor {here.parent / 'lua'} "
        f"holds {PRELUDE[0]}.lua (a broken install?)"
    )


def prelude_text(folder: Path | None = None) -> str:
    """The prelude: the files of :data:`PRELUDE` joined in that order. Each
    file ends with its last line's newline and the join puts one blank line
    between two files, and nothing else: the server sees one prelude, as
    when it was one file (the split itself changed no script's SHA1)."""
    folder = lua_dir() if folder is None else folder
    return "\n".join((folder / f"{name}.lua").read_text(encoding="utf-8") for name in PRELUDE)


def _sources() -> tuple[str, dict[str, str]]:
    folder = lua_dir()
    bodies = {op: (folder / f"{op}.lua").read_text(encoding="utf-8") for op in OPERATIONS}
    return prelude_text(folder), bodies


def load_scripts() -> dict[str, str]:
    """Script text per operation, each with the prelude in front."""
    prelude, bodies = _sources()
    return {op: prelude + "\n" + body for op, body in bodies.items()}


#: The line of lua/prelude_state.lua that ends the names of a pool's keys
#: (which the Functions library keeps per pool) and starts the state of a
#: call.
CALL_MARK = "-- @call:"

#: How many pools' key names the Functions library keeps (about 2 KB each),
#: before it forgets them all and starts again.
NAMES_KEPT = 1000

#: The line of the prelude (the first of lua/prelude_defaults.lua) that ends
#: the state of a call and starts the helpers.
HELPERS_MARK = "-- @helpers:"


#: The functions of the server's Lua that the library reads once, into
#: locals of its own, instead of as globals on every use. A Functions
#: library's globals are an empty table whose metatable leads to the real
#: ones, so each global read costs a failed look-up and a metatable's
#: before it finds the value, and `redis.call` a third look-up after it
#: (about 8,500 instructions an uncontended acquire + release, of 23
#: commands); a local (an upvalue of the library's functions) costs none.
#: The values exist only while a function runs (when it loads, a library
#: sees `redis.register_function` alone), so the first call reads them.
#: Each is written in the library's text as its local: `_` for the dot
#: (`redis_call`), or after a name without one (`tonumber_`).
LIBRARY_LOCALS = (
    "redis.call", "redis.pcall", "string.sub", "string.find", "string.match", "string.format",
    "string.byte", "string.rep", "string.gsub", "string.char", "math.max", "math.min",
    "math.floor", "math.ceil", "tonumber", "tostring", "type", "ipairs", "pairs", "unpack",
    "setmetatable",
)  # fmt: skip

_GLOBAL_READ = re.compile(
    r"(?<![\w.:])(" + "|".join(re.escape(name) for name in LIBRARY_LOCALS) + r")(?![\w.])"
)


def _local_name(name: str) -> str:
    return name.replace(".", "_") if "." in name else name + "_"


def _as_locals(text: str) -> str:
    """``text`` with each name of :data:`LIBRARY_LOCALS` written as its
    local (``redis.call`` as ``redis_call``, ``tonumber`` as ``tonumber_``)."""
    return _GLOBAL_READ.sub(lambda m: _local_name(m.group(1)), text)


def library_text(prelude: str, bodies: dict[str, str], version: str) -> str:
    """The Functions library made of the same Lua as the scripts.

    ``local P = {}`` holds the helpers, defined once at load. ``begin(KEYS)``
    runs the prelude's state part: the names of the pool's keys (above
    :data:`CALL_MARK`) once per pool, kept across calls in ``NAMES``; then
    the state of the call (a ``local P`` of its own). A name is looked up
    in the state, then the helpers, then the names: the state's metatable
    leads to the helpers, and the helpers' metatable is set to the names
    of the call's pool at the start of each call whose pool is not the
    last call's (the server runs one call at a time). A helper or a
    default, read far more often than a key's name, is found at the second
    table rather than the third (about 1 % of a cycle's instructions,
    lua/README.md "Costs"). Each function wraps an operation's body after
    ``local P = begin(KEYS)``; ``KEYS`` and ``ARGV`` are its parameters, as
    the body expects. The whole text is the Lua of the files unchanged but
    for the server's functions it calls (:data:`LIBRARY_LOCALS`), which it
    reads as locals of the library, set by ``begin`` at the library's first
    call.
    """
    state, mark, helpers = prelude.partition(HELPERS_MARK)
    names, call_mark, call = state.partition(CALL_MARK)
    if not mark or not call_mark:
        raise ValueError(f"the prelude lacks its {CALL_MARK!r} or {HELPERS_MARK!r} line")
    local_names = ", ".join(_local_name(name) for name in LIBRARY_LOCALS)
    parts = [
        f"#!lua name=allocator_{version}",
        "local P = {}",
        f"local {local_names}",
        mark + helpers,
        # Kept across calls here, not made in each (prelude_defaults.lua).
        "P.LEASE_OF, P.RES_OF, P.TIME_OF = {0}, {0}, {0}",
        "local HELPERS = {__index = P}",
        # The names of a pool's keys, per META key: at most NAMES_KEPT pools'.
        "local NAMES, NAMED, NAMED_LAST = {}, 0, false",
        "local function names(KEYS)",
        names,
        "  return N",
        "end",
        "local function begin(KEYS)",
        "  if not redis_call then",
        f"    {local_names} =",
        "      @GLOBALS@",
        "  end",
        "  local named = NAMES[KEYS[1]]",
        "  if not named then",
        f"    if NAMED >= {NAMES_KEPT} then",
        "      NAMES, NAMED = {}, 0",
        "    end",
        "    named = names(KEYS)",
        "    NAMES[KEYS[1]], NAMED = named, NAMED + 1",
        "  end",
        # The helpers lead to this pool's names (set again only when the
        # call's pool is another than the last call's); the state (made
        # with the metatable `N` below) to the helpers.
        "  if named ~= NAMED_LAST then",
        "    setmetatable(P, named)",
        "    NAMED_LAST = named",
        "  end",
        "  local N = HELPERS",
        call_mark + call,
        "  return P",
        "end",
    ]
    for op, body in bodies.items():
        if op in READ_ONLY:
            parts += [
                f"redis.register_function{{function_name = '{op}_{version}',",
                "callback = function(KEYS, ARGV)",
                "local P = begin(KEYS)",
                body,
                "end, flags = {'no-writes'}}",
            ]
            continue
        parts += [
            f"redis.register_function('{op}_{version}', function(KEYS, ARGV)",
            "local P = begin(KEYS)",
            body,
            "end)",
        ]
    # (The globals are read as they are, in the one line that reads them.)
    text = _as_locals("\n".join(parts))
    return text.replace("@GLOBALS@", ", ".join(LIBRARY_LOCALS), 1) + "\n"


def declared(keys: tuple[str, ...], cluster: bool) -> tuple[str, ...]:
    """The keys a call of a pool's script declares to the server, of the
    pool's keys (``Pool.keys``): its ``meta`` key. The script names every
    other key from it (lua/prelude_state.lua), as they share its hash tag,
    so its slot; each key declared costs the server about 1,400
    instructions a call. A Cluster client declares the others too, after
    it (the script does not read them): a slot that is moving then stops
    the whole call before it starts (``ASK`` or ``TRYAGAIN``), never
    between two of its writes. No call declares a signal list: a script
    names the one it pushes to, or takes a grant back from, from the
    client id in the ticket or the lease."""
    return (keys[0], *keys[1 : len(KEY_SUFFIXES)]) if cluster else (keys[0],)


#: How a client runs the scripts, once known.
FUNCTIONS, SCRIPTS = "functions", "scripts"

_log = logging.getLogger("allocator")


class Scripts:
    """The pool scripts by operation: their text and SHA1, and the Functions
    library built from them.

    Calls go out as plain commands (``FCALL``, ``EVALSHA``, ``EVAL``):
    redis-py's ``Script`` wrapper costs about a third more client CPU.
    """

    def __init__(self) -> None:
        prelude, bodies = _sources()
        self.text = {op: prelude + "\n" + body for op, body in bodies.items()}
        self.sha = {op: hashlib.sha1(t.encode("utf-8")).hexdigest() for op, t in self.text.items()}
        digest = hashlib.sha1("".join(self.sha.values()).encode()).hexdigest()
        #: A name per version of the Lua, so that processes running two
        #: versions side by side (a rolling upgrade) each find their own.
        self.version = digest[:12]
        self.library = library_text(prelude, bodies, self.version)
        self.function = {op: f"{op}_{self.version}" for op in OPERATIONS}
        self._modes: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: Clients whose server or ACL refused EVALSHA_RO/EVAL_RO: they run
        #: the read-only scripts with EVALSHA/EVAL.
        self._plain_reads: weakref.WeakSet[Any] = weakref.WeakSet()
        self.enabled = os.environ.get("ALLOCATOR_FUNCTIONS", "1").strip().lower() not in (
            "0",
            "false",
            "no",
            "off",
        )

    def mode(self, client: Any) -> str | None:
        """How ``client`` runs the scripts: FUNCTIONS, SCRIPTS, or None (not
        known yet: its first call tries the library)."""
        if not self.enabled or is_cluster(client):
            # A cluster client would ask a node for FCALL's keys on every
            # call (COMMAND GETKEYS); it routes EVALSHA by itself.
            return SCRIPTS
        return self._modes.get(client)

    def known(self, client: Any, op: str, keys: Any, args: Any) -> tuple[Any, ...] | None:
        """The one command that runs ``op`` on ``client`` once the client's
        way is known (FCALL, FCALL_RO, EVALSHA or EVALSHA_RO), or None before
        its first call. A shell sends it at once, the common case; should it
        fail, :meth:`invoke` takes over from that failure (``sent``)."""
        mode = self.mode(client)
        if mode is None:
            return None
        keys = declared(keys, is_cluster(client))
        if mode == FUNCTIONS:
            verb = "FCALL_RO" if op in READ_ONLY else "FCALL"
            return (verb, self.function[op], len(keys), *keys, *args)
        return (self._verbs(client, op)[0], self.sha[op], len(keys), *keys, *args)

    def _verbs(self, client: Any, op: str) -> tuple[str, str]:
        """How ``client`` runs ``op`` as a script: by SHA, by text."""
        # A cluster client routes EVALSHA by its keys itself, but would ask
        # a node for the keys of EVALSHA_RO on every call.
        if op in READ_ONLY and not is_cluster(client) and client not in self._plain_reads:
            return ("EVALSHA_RO", "EVAL_RO")
        return ("EVALSHA", "EVAL")

    def invoke(
        self,
        client: Any,
        op: str,
        keys: Any,
        args: Any,
        sent: tuple[tuple[Any, ...], ResponseError] | None = None,
    ) -> Generator[tuple[Any, ...], Any, Any]:
        """The commands that run operation ``op`` on ``client``: a flow that
        yields each command's arguments, is sent its reply (or thrown its
        error) and returns the operation's reply. No I/O of its own: the
        shells carry the commands out. ``sent``: a command of :meth:`known`
        that the shell sent already, and the error it met; the flow goes on
        from there instead of sending it again."""
        keys = declared(keys, is_cluster(client))
        n = len(keys)
        read = op in READ_ONLY
        if self.mode(client) != SCRIPTS:
            verb = "FCALL_RO" if read else "FCALL"
            call = (verb, self.function[op], n, *keys, *args)
            try:
                if sent is not None and sent[0] == call:
                    raise sent[1]
                reply = yield call
            except ResponseError as exc:
                trouble = _functions_trouble(exc)
                if trouble is None:
                    raise
                if trouble == "unsupported":
                    self._fall_back(client, exc)
                # A read loads nothing: without the library it runs as a script.
                elif not read and (yield from self._load(client)):
                    try:
                        reply = yield call
                    except ResponseError as again:
                        # Flushed again between the load and the call: this
                        # call runs as a script, which no flush can race.
                        if _functions_trouble(again) != "missing":
                            raise
                    else:
                        self._modes[client] = FUNCTIONS
                        return reply
            else:
                self._modes[client] = FUNCTIONS
                return reply
        by_sha, by_text = self._verbs(client, op)
        try:
            return (yield from self._script(op, by_sha, by_text, keys, args, sent))
        except ResponseError as exc:
            if by_sha == "EVALSHA" or not _read_only_refused(exc):
                raise
            # Redis 6.2, fakeredis, or an ACL without them: the same
            # read-only script by EVALSHA, for good (it writes nothing either).
            _log.debug("allocator: reading with EVALSHA, not EVALSHA_RO: %s", exc)
            self._plain_reads.add(client)
        return (yield from self._script(op, "EVALSHA", "EVAL", keys, args, None))

    def _script(
        self,
        op: str,
        by_sha: str,
        by_text: str,
        keys: Any,
        args: Any,
        sent: tuple[tuple[Any, ...], ResponseError] | None,
    ) -> Generator[tuple[Any, ...], Any, Any]:
        """Run ``op`` as a script: by its SHA, else (NOSCRIPT) by its text."""
        n = len(keys)
        try:
            command = (by_sha, self.sha[op], n, *keys, *args)
            if sent is not None and sent[0] == command:
                raise sent[1]
            return (yield command)
        except NoScriptError:
            # Flushed, restarted, failed over: run it by its text, which
            # caches it again. Unlike SCRIPT LOAD then EVALSHA, no flush can
            # land in between.
            return (yield (by_text, self.text[op], n, *keys, *args))

    def _load(self, client: Any) -> Generator[tuple[Any, ...], Any, bool]:
        """Load the library (a new server, a restart, FUNCTION FLUSH).
        False if this client may not, or the server cannot."""
        try:
            yield ("FUNCTION", "LOAD", "REPLACE", self.library)
        except ResponseError as exc:
            if _functions_trouble(exc) != "unsupported":
                raise
            if isinstance(exc, NoPermissionError):
                # A user that may call the library but not load it: this call
                # runs as a script (if its ACL allows); the next one looks for
                # the library again, which an admin may have loaded since.
                _log.warning(
                    "allocator: the Functions library allocator_%s is not loaded on this "
                    "server and this user may not load it (allocator.load_functions)",
                    self.version,
                )
            else:
                self._fall_back(client, exc)
            return False
        _log.debug("allocator: loaded the Functions library allocator_%s", self.version)
        return True

    def _fall_back(self, client: Any, error: BaseException) -> None:
        if self._modes.get(client) != SCRIPTS:
            _log.info("allocator: running the Lua as scripts (EVALSHA), not Functions: %s", error)
        self._modes[client] = SCRIPTS


def _functions_trouble(error: ResponseError) -> str | None:
    """``"missing"``: the server has Functions but not this library;
    ``"unsupported"``: the server (Redis 6.2, fakeredis) or this user's ACL
    has no Functions; None: an error of the call itself."""
    text = str(error)
    lowered = text.lower()
    if "function not found" in lowered:
        return "missing"
    if isinstance(error, NoPermissionError) and any(
        name in lowered for name in ("'fcall'", "'fcall_ro'", "'function|load'", "'function'")
    ):
        return "unsupported"
    if "unknown command" in lowered and ("fcall" in lowered or "function" in lowered):
        return "unsupported"
    return None


def _read_only_refused(error: ResponseError) -> bool:
    """Did the server (Redis 6.2, fakeredis) or the user's ACL refuse
    EVALSHA_RO or EVAL_RO itself (not a command inside the script)?"""
    if isinstance(error, NoScriptError):
        return False
    lowered = str(error).lower()
    if "unknown command" in lowered and "_ro" in lowered:
        return True
    return isinstance(error, NoPermissionError) and any(
        f"{quote}{name}{quote}" in lowered for name in ("evalsha_ro", "eval_ro") for quote in "'`"
    )


_SCRIPTS: list[Scripts] = []


def scripts() -> Scripts:
    """The scripts, read from disk once per process."""
    if not _SCRIPTS:
        _SCRIPTS.append(Scripts())
    return _SCRIPTS[0]


def load_functions(client: Any) -> str:
    """Load this version's Functions library on the server of `client` (a
    blocking `redis.Redis`; on a `redis.cluster.RedisCluster`, on every
    master) and return its name, `allocator_<digest>`. Needs Redis >= 7 or
    Valkey.

    For an admin: the library loads itself on a pool's first write
    (`status()`, `leases()`, `stats()` and `clients()` never load it:
    without it they run as read-only scripts), unless the users' ACL allows
    `FCALL` but not `FUNCTION LOAD`
    ([operations](operations.md#only-the-librarys-own-code)).

    An asyncio client raises `TypeError` (its command would only be a
    coroutine, never run): `await load_functions_async(client)` instead.
    """
    if client_kind(client) != "sync":
        raise TypeError(
            "client is an asyncio client: load_functions needs a blocking one; "
            "use `await allocator.load_functions_async(client)`"
        )
    made = scripts()
    client.execute_command("FUNCTION", "LOAD", "REPLACE", made.library)
    return f"allocator_{made.version}"


async def load_functions_async(client: Any) -> str:
    """Same as [`load_functions`][allocator.load_functions], awaitable, for
    an asyncio client (`redis.asyncio.Redis`,
    `redis.asyncio.cluster.RedisCluster`); a blocking one raises
    `TypeError`."""
    if client_kind(client) != "async":
        raise TypeError(
            "client is a blocking client: load_functions_async needs an asyncio one; "
            "use allocator.load_functions(client)"
        )
    made = scripts()
    await client.execute_command("FUNCTION", "LOAD", "REPLACE", made.library)
    return f"allocator_{made.version}"
