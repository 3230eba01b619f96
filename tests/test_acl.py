"""Every ACL line that docs/operations.md documents, tried on a real server:
the library runs as that user, and a per-pool user is refused another
pool's keys (docs/operations.md#one-user-per-pool)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import wait_until
from redis.exceptions import NoPermissionError

from allocator import AcquireTimeout, FairAllocator, acl_key_pattern, load_functions
from allocator._server import RedisServer

pytestmark = pytest.mark.real_redis

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def documented_lines() -> list[str]:
    lines = re.findall(r"^ACL SETUSER .*$", DOC.read_text(encoding="utf-8"), flags=re.M)
    assert len(lines) == 5, lines
    return [line for line in lines if "alloc-monitor" not in line]


def monitor_line() -> str:
    text = DOC.read_text(encoding="utf-8")
    lines = re.findall(r"^ACL SETUSER alloc-monitor .*$", text, flags=re.M)
    assert len(lines) == 1, lines
    return lines[0]


def script_lines() -> list[str]:
    return [x for x in documented_lines() if "+evalsha" in x]


def needs_functions(server: RedisServer) -> None:
    version = redis.Redis.from_url(server.url).info("server")["redis_version"]
    if int(str(version).split(".")[0]) < 7:
        pytest.skip(f"server {version} has no Functions")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


def as_user(server: RedisServer, line: str, user: str, keys: str) -> Any:
    """Create the documented user (its key pattern replaced by ``keys``) and
    return a client logged in as it."""
    words = line.split()[2:]  # after ACL SETUSER
    words[0] = user
    words = [w for w in words if not w.startswith(("~", "&"))]
    words.insert(words.index("resetkeys") + 1, "~" + keys)
    if "resetchannels" in words:  # the presence channels share the keys' pattern
        words.insert(words.index("resetchannels") + 1, "&" + keys.removeprefix("%R~"))
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", *[w.replace(">CHANGE-ME", ">pw") for w in words])
    admin.close()
    return redis.Redis.from_url(server.url, username=user, password="pw")


def exercise(pool: FairAllocator) -> None:
    """Every operation of the library, as the restricted user."""
    pool.extend(["a", "b"], capacity=1)
    lease = pool.acquire(timeout=10, bind="job")
    lease = pool.renew(lease)
    waiter = pool.acquire(timeout=10)  # the second resource
    assert pool.acquire(blocking=False) is None
    assert pool.release(waiter, quarantine=0.01)
    pool.bind("other", "b")
    assert pool.unbind("other")
    assert pool.status().size == 2
    pool.gc()
    assert pool.release(lease)
    # Several at once, as the restricted user: granted in the reply; a
    # request that times out (cancel with a count); a count over the size.
    pair = pool.acquire_many(2, timeout=10)
    with pytest.raises(AcquireTimeout):
        pool.acquire_many(2, timeout=0.05)
    with pytest.raises(ValueError, match="count"):
        pool.acquire_many(3, timeout=1)
    assert all(pool.release(each) for each in pair)
    # The user keeps a presence in its pool (its channel is in the line):
    # its holder is seen connected.
    held = pool.acquire(timeout=10)
    assert [info.holder_present for info in pool.leases()] == [True]
    assert pool.release(held)
    assert pool.remove(["a", "b"]) == 2


def test_the_per_pool_line(server: RedisServer) -> None:
    line = next(x for x in script_lines() if "~alloc:{proxies}:*" in x)
    # Names with glob characters must not widen the pattern: '*' must not
    # cover 'star-and-more', '?x' must not cover 'ax'.
    pairs = [
        ("proxies", "proxies2"), ("*", "star-and-more"), ("?x", "ax"), ("[ab]", "a"),
        ("back\\slash", "backslash"), ("{b}", "b"),
    ]  # fmt: skip
    for name, neighbour in pairs:
        user = as_user(server, line, f"u{abs(hash(name))}", acl_key_pattern(name))
        exercise(FairAllocator(user, name))
        FairAllocator(redis.Redis.from_url(server.url), neighbour).extend(["n"])
        other = FairAllocator(user, neighbour)
        with pytest.raises(NoPermissionError):
            other.status()
        with pytest.raises(NoPermissionError):
            other.acquire(timeout=5)
        user.close()


def test_the_every_pool_line(server: RedisServer) -> None:
    line = next(x for x in script_lines() if "~alloc:*" in x)
    user = as_user(server, line, "every", "alloc:*")
    for name in ("one", "two"):
        exercise(FairAllocator(user, name))
    # Without the optional +config|get the maxmemory check is skipped, and
    # a user limited to the prefix's keys gets no key of another prefix.
    with pytest.raises(NoPermissionError):
        FairAllocator(user, "one", prefix="elsewhere").status()
    user.close()


def test_documented_commands_are_exactly_what_the_scripts_call() -> None:
    lua = Path(__file__).resolve().parent.parent / "lua"
    called = {
        m.lower()
        for f in lua.glob("*.lua")
        for m in re.findall(r"redis\.p?call\('([A-Za-z]+)'", f.read_text(encoding="utf-8"))
    }
    for line in documented_lines():
        granted = {w[1:].split("|")[0] for w in line.split() if w.startswith("+")}
        assert called <= granted, called - granted
        client = {"fcall", "fcall_ro"} if "+fcall" in line else {"evalsha", "eval"}
        presence = {"ssubscribe", "subscribe"}  # the client's presence connection
        assert granted - called == client | presence | {"blpop", "blmpop", "lpop"}, granted - called


def test_the_line_that_may_only_call_the_library(server: RedisServer) -> None:
    """The least-privilege role: FCALL of the library an admin loaded, no
    EVAL, no FUNCTION LOAD. It runs every operation and no Lua of its own."""
    needs_functions(server)
    line = next(x for x in documented_lines() if "+fcall" in x)
    admin = redis.Redis.from_url(server.url)
    admin.function_flush()
    user = as_user(server, line, "fcall-only", acl_key_pattern("proxies"))
    pool = FairAllocator(user, "proxies")
    with pytest.raises(NoPermissionError):  # not loaded yet, and it may not load it
        pool.status()
    assert load_functions(admin).startswith("allocator_")
    exercise(pool)
    with pytest.raises(NoPermissionError):
        user.eval("return 1", 0)
    with pytest.raises(NoPermissionError):
        user.function_load("#!lua name=mine\nredis.register_function('f', function() end)")


def test_the_read_only_line(server: RedisServer) -> None:
    """The monitoring user reads every pool (existing or not) and writes
    nothing: status, leases, stats and pools work; a writing call is refused."""
    admin = redis.Redis.from_url(server.url)
    pool = FairAllocator(admin, "watched")
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5, owner="job-1")
    pool.acquire(timeout=5, ttl=0.01)  # past its deadline soon: status must not reclaim it
    wait_until(lambda: pool.status().leased == 1, what="the short lease's deadline")
    admin.script_flush()  # the monitor's first call meets NOSCRIPT, then runs by EVAL
    words = monitor_line().split()[2:]
    words[0] = "monitor"
    admin.execute_command("ACL", "SETUSER", *[w.replace(">CHANGE-ME", ">pw") for w in words])
    user = redis.Redis.from_url(server.url, username="monitor", password="pw")
    seen = FairAllocator(user, "watched")
    status = seen.status()
    assert (status.size, status.leased, status.free, status.exists) == (2, 1, 1, True)
    assert [(i.resource, i.owner) for i in seen.leases()] == [(held.resource, "job-1")]
    assert seen.stats().grants == 2
    assert "watched" in FairAllocator.pools(user)
    missing = FairAllocator(user, "missing")
    assert (missing.status().size, missing.status().exists) == (0, False)
    assert missing.leases() == () and missing.stats().grants == 0
    assert admin.keys("alloc:{missing}:*") == []
    # Refused inside the script (a ResponseError; NoPermissionError is one).
    with pytest.raises(redis.ResponseError, match=r"can't run this command|NOPERM"):
        seen.extend(["c"])
    with pytest.raises(redis.ResponseError, match=r"can't run this command|NOPERM"):
        seen.acquire(timeout=1)
    # Reading wrote nothing: the expired lease is still there for a writer.
    assert admin.zcard("alloc:{watched}:exp") == 2
    user.close()
    admin.close()


def test_the_read_only_line_on_functions(server: RedisServer) -> None:
    """With the library loaded, a user with read-only keys and FCALL_RO only
    (no EVAL) reads pools; the server keeps it from writing."""
    needs_functions(server)
    admin = redis.Redis.from_url(server.url)
    load_functions(admin)
    pool = FairAllocator(admin, "watched-fn")
    pool.extend(["a"])
    pool.acquire(timeout=5, owner="job-2")
    text = DOC.read_text(encoding="utf-8")
    line = re.findall(r"^ACL SETUSER alloc-monitor-fn .*$", text, flags=re.M)[0]
    words = [w.replace(">CHANGE-ME", ">pw") for w in line.split()[2:]]
    words[0] = "monitor-fn"
    admin.execute_command("ACL", "SETUSER", *words)
    user = redis.Redis.from_url(server.url, username="monitor-fn", password="pw")
    seen = FairAllocator(user, "watched-fn")
    assert seen.status().leased == 1
    assert [i.owner for i in seen.leases()] == ["job-2"]
    assert seen.stats().grants == 1
    assert "watched-fn" in FairAllocator.pools(user)
    assert FairAllocator(user, "missing-fn").status().exists is False
    with pytest.raises(NoPermissionError):
        seen.extend(["b"])
    with pytest.raises(NoPermissionError):
        user.eval("return 1", 0)
    user.close()
    admin.close()


def test_a_user_without_the_channel_keeps_no_presence_and_says_so(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL line from before presence (no channel): the pool works as in
    0.2, judged by the liveness mark alone, and the log says so once."""
    line = next(x for x in script_lines() if "~alloc:{proxies}:*" in x)
    words = [w for w in line.split() if not w.startswith("&")]
    user = as_user(server, " ".join(words), "nochannel", acl_key_pattern("old"))
    # as_user gives the channel back: take it away again.
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "nochannel", "resetchannels")
    admin.close()
    pool = FairAllocator(user, "old")
    pool.extend(["a"])
    with caplog.at_level("WARNING", logger="allocator"):
        held = pool.acquire(timeout=10)
        assert pool.release(held)
        held = pool.acquire(timeout=10)
    assert [info.holder_present for info in pool.leases()] == [None]
    assert pool.release(held)
    warnings = [r for r in caplog.records if "no presence" in r.getMessage()]
    assert len(warnings) == 1
    user.close()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_refused_channel_leaves_the_presence_in_other_pools(
    server: RedisServer, shell: str
) -> None:
    """A client present in one pool and refused the presence channel of
    another (an ACL that names only the first) keeps its presence in the
    first: the refusal leaves the connection, and its subscriptions, as
    they were; another channel is joined on it after."""
    import asyncio

    import redis.asyncio

    from allocator._presence import AsyncPresence, Presence

    admin = redis.Redis.from_url(server.url)
    admin.execute_command(
        "ACL", "SETUSER", "onechannel", "on", ">pw", "+@all", "~*", "resetchannels",
        "&alloc:{ours}:*",
    )  # fmt: skip
    ours, theirs, more = "alloc:{ours}:p:c1", "alloc:{theirs}:p:c1", "alloc:{ours}:p:c2"

    def counted() -> int:
        try:
            reply = admin.execute_command("PUBSUB", "SHARDNUMSUB", ours)
        except redis.ResponseError:  # Redis 6.2: plain channels
            reply = admin.execute_command("PUBSUB", "NUMSUB", ours)
        return int(reply[1])

    async def run_async() -> list[Any]:
        user = redis.asyncio.Redis.from_url(server.url, username="onechannel", password="pw")
        presence = AsyncPresence(user, "alloc:{ours}:meta")
        seen = [await presence.join(ours, 10), await presence.join(theirs, 10), counted()]
        seen += [await presence.listen(0), await presence.join(more, 10)]
        await presence.close()
        await user.aclose()
        return seen

    if shell == "async":
        seen = asyncio.run(run_async())
    else:
        user = redis.Redis.from_url(server.url, username="onechannel", password="pw")
        presence = Presence(user, "alloc:{ours}:meta")
        seen = [presence.join(ours, 10), presence.join(theirs, 10), counted()]
        seen += [presence.listen(0), presence.join(more, 10)]
        presence.close()
        user.close()
    # Joined; refused; still counted there, on the same open connection; joined.
    assert seen == [True, False, 1, [], True]
    admin.execute_command("ACL", "DELUSER", "onechannel")
    admin.close()
