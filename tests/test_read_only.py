"""Reads write nothing (lua/README.md, "Reads that write nothing"):
``status()``, ``leases()``, ``stats()``, ``pools()`` (sync and asyncio) and the CLI's ``pools``,
``status`` and ``watch`` load no library and write no key, on a private
server without the Functions library (Redis 7: they run as ``EVALSHA_RO``;
Redis 6.2, the ``redis62`` run of the matrix: as ``EVALSHA``) and with it
(``FCALL_RO``). Every command the server ran is seen with ``MONITOR``; the
server's own count of writes (``rdb_changes_since_last_save``) must not move.
Before the fix the first read ran ``FUNCTION LOAD`` (one write) on Redis 7."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from helpers import wait_until
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from allocator import AsyncFairAllocator, FairAllocator, load_functions
from allocator._scripts import OPERATIONS, READ_ONLY, SCRIPTS, Scripts, scripts
from allocator._server import RedisServer
from allocator.cli import main

pytestmark = pytest.mark.real_redis

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A private server: the tests flush its scripts and functions."""
    with RedisServer() as made:
        yield made


@pytest.fixture
def admin(server: RedisServer) -> Iterator[Any]:
    client = redis.Redis.from_url(server.url, protocol=2, decode_responses=True)
    yield client
    client.close()


def has_functions(admin: Any) -> bool:
    return int(str(admin.info("server")["redis_version"]).split(".")[0]) >= 7


def writes(admin: Any) -> int:
    """How many writes the server has counted (every write adds to it)."""
    return int(admin.info("persistence")["rdb_changes_since_last_save"])


def script_cache(admin: Any) -> dict[str, bool]:
    made = scripts()
    cached = admin.script_exists(*made.sha.values())
    return dict(zip(made.sha, cached, strict=True))


def unquote(word: str) -> bytes:
    """A word of a MONITOR line as the client sent it (the server escapes
    quotes, backslashes, control and non-ASCII bytes: sdscatrepr)."""
    named = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}
    out, i = bytearray(), 0
    while i < len(word):
        char = word[i]
        if char != "\\":
            out += char.encode()
            i += 1
        elif word[i + 1] == "x":
            out.append(int(word[i + 2 : i + 4], 16))
            i += 4
        else:
            out += named.get(word[i + 1], word[i + 1].encode())
            i += 2
    return bytes(out)


class Monitor:
    """Every command the server runs while the block runs (``MONITOR`` on a
    connection of its own, read by a thread): (``"lua"`` for a command a
    script called, else ``"tcp"``; the command's words)."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._mark = f"monitor-end-{uuid.uuid4().hex}"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._url = url
        self.seen: list[tuple[str, list[bytes]]] = []

    def _listen(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            while True:
                line = monitor.connection.read_response()
                line = line.decode() if isinstance(line, bytes) else str(line)
                match = re.match(r"^[0-9.]+ \[[0-9]+ (\S+)\] (.*)$", line, flags=re.S)
                assert match, line[:200]
                words = [unquote(w) for w in re.findall(r'"((?:[^"\\]|\\.)*)"', match[2])]
                if words[0].lower() == b"echo" and words[1:] == [self._mark.encode()]:
                    return
                self.seen.append(("lua" if match[1] == "lua" else "tcp", words))

    def __enter__(self) -> Monitor:
        self._thread.start()
        assert self._ready.wait(10), "MONITOR did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        marker = redis.Redis.from_url(self._url)
        marker.echo(self._mark)  # the last command the thread reads
        marker.close()
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR did not see the end mark"
        self._client.close()


def check_nothing_written(admin: Any, seen: list[tuple[str, list[bytes]]]) -> list[str]:
    """Assert that no command seen writes, loads or changes a script or
    function, and that every script run is a read; the verbs sent by
    clients (not by scripts)."""
    made = scripts()
    read_shas = {made.sha[op].encode() for op in READ_ONLY}
    read_functions = {made.function[op].encode() for op in READ_ONLY}
    names = sorted({words[0].decode().lower() for _, words in seen})
    infos = admin.execute_command("COMMAND", "INFO", *names)
    for name, info in zip(names, infos, strict=True):
        assert name not in ("function", "script"), name
        flags = {f.lower() if isinstance(f, str) else f.decode().lower() for f in info[2]}
        assert "write" not in flags, (name, flags)
    verbs = []
    for where, words in seen:
        verb = words[0].decode().lower()
        if where == "lua":
            continue
        verbs.append(verb)
        if verb in ("evalsha", "evalsha_ro"):
            assert words[1] in read_shas, words[:2]
        elif verb in ("fcall", "fcall_ro"):
            assert words[1] in read_functions, words[:2]
        elif verb in ("eval", "eval_ro"):
            assert hashlib.sha1(words[1]).hexdigest().encode() in read_shas, words[1][:80]
    return verbs


def prepare(admin: Any, url: str, name: str) -> None:
    """A pool with two resources, a live lease, and one past its deadline
    (a writer would reclaim it: a read must not); then no script and no
    function on the server."""
    writer = redis.Redis.from_url(url)
    pool = FairAllocator(writer, name)
    pool.extend(["a", "b", "c"])
    pool.acquire(timeout=5, owner="job-1")
    pool.acquire(timeout=5, ttl=0.01)
    wait_until(lambda: pool.status().leased == 1, what="the short lease's deadline")
    writer.close()
    admin.script_flush()
    if has_functions(admin):
        admin.function_flush()


def read_everything(url: str, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every read-only call, sync, asyncio and on the command line, each
    with a client of its own (so each chooses its way afresh)."""
    client = redis.Redis.from_url(url)
    pool = FairAllocator(client, name)
    status = pool.status()
    assert (status.size, status.leased, status.free) == (3, 1, 2)
    assert [i.owner for i in pool.leases()] == ["job-1"]
    assert pool.stats().grants == 2
    assert name in FairAllocator.pools(client)
    missing = FairAllocator(client, f"{name}-missing")
    assert missing.status().exists is False
    assert missing.leases() == () and missing.stats().grants == 0
    client.close()

    async def read_async() -> None:
        aclient = redis.asyncio.Redis.from_url(url)
        apool = AsyncFairAllocator(aclient, name)
        assert (await apool.status()).leased == 1
        assert [i.owner for i in await apool.leases()] == ["job-1"]
        assert (await apool.stats()).grants == 2
        assert name in await AsyncFairAllocator.pools(aclient)
        assert (await AsyncFairAllocator(aclient, f"{name}-missing").status()).exists is False
        await aclient.aclose()

    asyncio.run(read_async())

    for argv in (["pools"], ["status", name], ["watch", name, "--count", "1"]):
        assert main([*argv, "--url", url]) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert name in out


@pytest.mark.parametrize("library", ["absent", "loaded"])
def test_reads_load_nothing_and_write_nothing(
    server: RedisServer, admin: Any, library: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if library == "loaded" and not has_functions(admin):
        pytest.skip("the server has no Functions")
    name = f"ro-{library}"
    prepare(admin, server.url, name)
    if library == "loaded":
        load_functions(admin)
    functions_before = admin.function_list() if has_functions(admin) else None
    cache_before, writes_before = script_cache(admin), writes(admin)

    with Monitor(server.url) as monitor:
        read_everything(server.url, name, capsys)

    verbs = check_nothing_written(admin, monitor.seen)
    assert writes(admin) == writes_before
    if functions_before is not None:
        assert admin.function_list() == functions_before
    # Only the read-only scripts may have been cached (by EVAL_RO or EVAL
    # after NOSCRIPT: caching a script writes no key and is not replicated).
    cache_after = script_cache(admin)
    assert {op: cache_after[op] for op in OPERATIONS if op not in READ_ONLY} == {
        op: cache_before[op] for op in OPERATIONS if op not in READ_ONLY
    }
    # Read, but not reclaimed: the lease past its deadline is for a writer.
    assert admin.zcard(f"alloc:{{{name}}}:exp") == 2
    if library == "loaded":
        assert "fcall_ro" in verbs
        assert not {"evalsha", "evalsha_ro", "eval", "eval_ro"} & set(verbs), set(verbs)
    elif has_functions(admin):
        assert {"evalsha_ro", "eval_ro"} <= set(verbs), set(verbs)
        assert not {"evalsha", "eval"} & set(verbs), set(verbs)
    else:  # Redis 6.2: plain EVALSHA of the read-only scripts
        assert {"evalsha", "eval"} <= set(verbs), set(verbs)


def monitor_lines() -> tuple[str, str]:
    """The documented monitoring user (EVALSHA, for every server), and on
    Redis >= 7 the one the doc derives from it (EVALSHA_RO, read-only keys)."""
    text = DOC.read_text(encoding="utf-8")
    line = re.findall(r"^ACL SETUSER alloc-monitor .*$", text, flags=re.M)[0]
    # The doc's own words for the stricter variant, applied to its line.
    assert "`%R~alloc:*` in place of `~alloc:*`" in text
    assert "`+fcall_ro +evalsha_ro +eval_ro` in place of `+evalsha +eval`" in text
    strict = line.replace(" ~alloc:*", " %R~alloc:*").replace(
        "+evalsha +eval", "+fcall_ro +evalsha_ro +eval_ro"
    )
    return line, strict


@pytest.mark.parametrize("variant", ["evalsha", "evalsha_ro"])
def test_a_monitoring_user_reads_where_the_library_is_not_loaded(
    server: RedisServer, admin: Any, variant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line, strict = monitor_lines()
    if variant == "evalsha_ro":
        if not has_functions(admin):
            pytest.skip("Redis 6.2 has no EVALSHA_RO")
        line = strict
    name = f"ro-user-{variant}"
    prepare(admin, server.url, name)
    user = f"monitor-{variant}"
    words = [w.replace(">CHANGE-ME", ">pw") for w in line.split()[2:]]
    words[0] = user
    admin.execute_command("ACL", "SETUSER", *words)
    url = server.url.replace("redis://", f"redis://{user}:pw@")
    functions_before = admin.function_list() if has_functions(admin) else None
    writes_before = writes(admin)

    with Monitor(server.url) as monitor:
        read_everything(url, name, capsys)
        client = redis.Redis.from_url(url)
        pool = FairAllocator(client, name)
        refused = NoPermissionError if variant == "evalsha_ro" else ResponseError
        with pytest.raises(refused):
            pool.extend(["d"])
        with pytest.raises(refused):
            pool.release(pool.acquire(timeout=1))
        client.close()

    # The writes it tried were refused (not run): leave them out.
    tried = {b"evalsha", b"eval", b"fcall"}
    check_nothing_written(admin, [x for x in monitor.seen if x[1][0].lower() not in tried])
    assert writes(admin) == writes_before
    if functions_before is not None:
        assert admin.function_list() == functions_before
    assert admin.zcard(f"alloc:{{{name}}}:exp") == 2


# -- how a read is sent, without a server ------------------------------------------


def drive(flow: Any, answers: dict[str, Any]) -> tuple[Any, list[str]]:
    """Run a flow of ``Scripts.invoke``, answering each command by its verb
    (an exception is raised into the flow); the result and the verbs."""
    verbs: list[str] = []
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            command = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value, verbs
        verb = f"{command[0]} {command[1]}" if command[0] == "FUNCTION" else command[0]
        verbs.append(verb)
        answer = answers[verb]
        reply, error = (None, answer) if isinstance(answer, BaseException) else (answer, None)


class Client:
    """Something a ``Scripts`` can keep per-client state for."""


def test_a_read_on_a_server_without_the_library_loads_nothing() -> None:
    made, client = Scripts(), Client()
    answers = {
        "FCALL_RO": ResponseError("Function not found"),
        "EVALSHA_RO": NoScriptError("NOSCRIPT No matching script."),
        "EVAL_RO": "read",
    }
    for op in sorted(READ_ONLY):
        result, verbs = drive(made.invoke(client, op, ("k",), ()), answers)
        assert (result, verbs) == ("read", ["FCALL_RO", "EVALSHA_RO", "EVAL_RO"])
    # A write loads the library (as before), and then runs it.
    flow = made.invoke(client, "acquire", ("k",), ())
    assert next(flow)[0] == "FCALL"
    assert flow.throw(ResponseError("Function not found"))[:2] == ("FUNCTION", "LOAD")


@pytest.mark.parametrize(
    "refusal",
    [
        ResponseError("unknown command 'EVALSHA_RO', with args beginning with: 'x' "),
        ResponseError("ERR unknown command `EVALSHA_RO`, with args beginning with: `x`, "),
        NoPermissionError("User m has no permissions to run the 'evalsha_ro' command"),
    ],
    ids=["redis-7-style", "redis-6.2", "acl"],
)
def test_a_server_or_user_without_evalsha_ro_reads_with_evalsha(refusal: Exception) -> None:
    made, client = Scripts(), Client()
    answers = {
        "FCALL_RO": ResponseError("unknown command 'FCALL_RO'"),
        "EVALSHA_RO": refusal,
        "EVALSHA": NoScriptError("NOSCRIPT No matching script."),
        "EVAL": "read",
    }
    result, verbs = drive(made.invoke(client, "status", ("k",), ()), answers)
    assert (result, verbs) == ("read", ["FCALL_RO", "EVALSHA_RO", "EVALSHA", "EVAL"])
    assert made.mode(client) == SCRIPTS
    # Learnt once: the next read goes straight to EVALSHA.
    assert made.known(client, "leases", ("k",), ())[0] == "EVALSHA"  # type: ignore[index]
    # A refusal inside the script is the caller's error, not a way to choose.
    other = Client()
    inner = NoPermissionError("User m has no permissions to run the 'hgetall' command")
    made._modes[other] = SCRIPTS
    with pytest.raises(NoPermissionError):
        drive(made.invoke(other, "status", ("k",), ()), {"EVALSHA_RO": inner})
    assert made.known(other, "status", ("k",), ())[0] == "EVALSHA_RO"  # type: ignore[index]


def test_a_cluster_client_reads_with_evalsha() -> None:
    """redis-py routes EVALSHA by its keys, but asks a node for the keys of
    EVALSHA_RO on every call: a cluster client reads with EVALSHA."""

    class Cluster(Client):
        nodes_manager = None

    made, client = Scripts(), Cluster()
    command = made.known(client, "status", ("k",), ())
    assert command is not None and command[0] == "EVALSHA"
