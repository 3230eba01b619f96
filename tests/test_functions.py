"""The Functions library (docs/operations.md#only-the-librarys-own-code): the
same Lua as the scripts, loaded once per server and called with FCALL where
the server has Functions; the scripts (EVALSHA) where it, the client or the
user's ACL has none. The
rest of the suite runs on whichever path the server gives (Functions on
Redis 7 and Valkey, scripts on Redis 6.2, the last run of `.ci/run`'s
matrix). A storm of FUNCTION FLUSH is in tests/test_errors.py, beside the
storm of SCRIPT FLUSH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
import redis
from helpers import Stepper, queued

from allocator import FairAllocator
from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import (
    _GLOBAL_READ,
    FUNCTIONS,
    LIBRARY_LOCALS,
    OPERATIONS,
    READ_ONLY,
    SCRIPTS,
    _as_locals,
    _sources,
    declared,
    library_text,
    scripts,
)

pytestmark = pytest.mark.real_redis


def has_functions(client: Any) -> bool:
    return int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7


def calls(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("fcall", "evalsha", "eval")}


@pytest.fixture
def client(redis_url: str) -> Any:
    made = redis.Redis.from_url(redis_url)
    if not has_functions(made):
        pytest.skip("the server has no Functions")
    yield made
    made.close()


def test_the_library_is_the_scripts_with_the_helpers_defined_once() -> None:
    made = scripts()
    text = made.library
    assert text.startswith(f"#!lua name=allocator_{made.version}\n")
    _prelude, bodies = _sources()
    for op in OPERATIONS:
        if op in READ_ONLY:  # flagged no-writes, called with FCALL_RO
            assert f"redis.register_function{{function_name = '{op}_{made.version}'," in text
            continue
        assert f"redis.register_function('{op}_{made.version}'," in text
        # Each body unchanged, but for the globals it reads as locals.
        assert _as_locals(bodies[op]) in text
    # The helpers are defined once, at load: outside every function body.
    assert text.count("function P:grant(") == 1
    assert text.index("function P:grant(") < text.index("local function begin(KEYS)")
    with pytest.raises(ValueError, match="@helpers"):
        library_text("local P = {}\n", {"x": "return 1"}, "v")


def test_the_library_reads_the_globals_it_calls_once() -> None:
    """The library reads the server's functions it calls (``redis.call``,
    ``string.sub``, ``tonumber``...) into locals once, at its first call,
    and uses the locals after: one line reads the globals, and no other
    code does. The rewrite touches code only: no string in the scripts
    holds one of the names."""
    text = scripts().library
    code = "\n".join(line.split("--")[0] for line in text.split("\n"))
    read = _GLOBAL_READ  # a read of one of LIBRARY_LOCALS' names
    lines = [line for line in code.split("\n") if read.search(line)]
    assert len(lines) == 1 and lines[0].strip().startswith("redis.call, redis.pcall,")
    # Every name the line reads, in the order of the locals it sets.
    assert [m.group(1) for m in read.finditer(lines[0])] == list(LIBRARY_LOCALS)
    prelude, bodies = _sources()
    for source in (prelude, *bodies.values()):
        for line in source.split("\n"):
            for literal in re.findall(r"'[^']*'|\"[^\"]*\"", line.split("--")[0]):
                assert not read.search(literal), literal


def test_a_server_with_functions_runs_the_library(client: Any, pool_name: str) -> None:
    client.function_flush()
    pool = FairAllocator(client, pool_name)
    before = calls(client)
    pool.extend(["a", "b"])
    lease = pool.acquire(timeout=5)
    assert pool.release(lease)
    after = calls(client)
    assert scripts().mode(client) == FUNCTIONS
    # The first call found no library and loaded it; then every call is FCALL.
    assert after["evalsha"] == before["evalsha"] and after["eval"] == before["eval"]
    # extend (before the load, and again after it: the first may or may not
    # count), acquire, release.
    assert after["fcall"] - before["fcall"] in (3, 4)
    assert client.function_list(library=f"allocator_{scripts().version}")


def test_a_user_whose_acl_refuses_fcall_runs_the_scripts(
    client: Any, redis_url: str, pool_name: str
) -> None:
    client.execute_command("ACL", "SETUSER", "nofcall", "on", ">pw", "~*", "+@all", "-fcall")
    url = redis_url.replace("redis://", "redis://nofcall:pw@")
    user = redis.Redis.from_url(url)
    pool = FairAllocator(user, pool_name)
    pool.extend(["a"])
    before = calls(client)
    assert pool.release(pool.acquire(timeout=5))
    after = calls(client)
    assert scripts().mode(user) == SCRIPTS
    assert after["fcall"] == before["fcall"]  # chosen once: never tried again
    assert after["evalsha"] - before["evalsha"] == 2
    user.close()
    client.execute_command("ACL", "DELUSER", "nofcall")


def test_the_environment_can_keep_every_client_on_scripts(redis_url: str, pool_name: str) -> None:
    code = (
        "import redis, sys\n"
        "from allocator import FairAllocator\n"
        "from allocator._scripts import scripts\n"
        f"c = redis.Redis.from_url({redis_url!r})\n"
        f"p = FairAllocator(c, {pool_name!r})\n"
        "p.extend(['a']); p.release(p.acquire(timeout=5))\n"
        "print(scripts().mode(c))\n"
    )
    env = {**os.environ, "ALLOCATOR_FUNCTIONS": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == SCRIPTS


def test_a_call_declares_meta_and_a_cluster_client_every_key(client: Any) -> None:
    """A call declares the pool's META key (the scripts name the rest from
    it); a Cluster client declares every key of the pool after it, so that
    a moving slot stops the call before it starts. The scripts read the
    same pool either way."""
    pool = FairAllocator(client, "declared")._pool
    assert declared(pool.keys, False) == (pool.keys[0],)
    # Every key of the pool, not the signal lists' prefix.
    assert declared(pool.keys, True) == pool.keys[:-1]
    alloc = FairAllocator(client, "declared")
    alloc.extend(["a", "b"])
    held = alloc.acquire(timeout=5)
    text = scripts().text["stats"]
    replies = [
        client.execute_command("EVAL", text, len(keys), *keys)
        for keys in (declared(pool.keys, False), declared(pool.keys, True))
    ]
    assert replies[0][2:] == replies[1][2:] and b"w1" in replies[0]  # [1]: the clock
    alloc.release(held)


def test_records_changed_by_others_are_read_as_changed(client: Any, pool_name: str) -> None:
    """The library keeps the lease and resource records it writes, by their
    text, so that the next call reads them without parsing them again
    (lua/README.md, "Costs"): a record that anyone else changed is read as
    the pool now holds it."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["a"])
    lease = pool.acquire(timeout=5)
    assert scripts().mode(client) == FUNCTIONS
    keys = dict(zip(KEY_SUFFIXES, pool._pool.keys, strict=False))
    # The lease's deadline (its fifth field), moved into the past by hand:
    # its release finds it over.
    fields = client.hget(keys["recs"], lease.id).decode().split("|")
    fields[4] = "1"
    client.hset(keys["recs"], lease.id, "|".join(fields))
    assert pool.release(lease) is False
    # The resource's capacity (its first field), raised by hand: it is
    # granted twice at once.
    fields = client.hget(keys["res"], "a").decode().split("|")
    fields[0] = "2"
    client.hset(keys["res"], "a", "|".join(fields))
    first, second = pool.acquire(blocking=False), pool.acquire(blocking=False)
    assert first is not None and second is not None
    assert pool.release(first) and pool.release(second)


def test_interleaved_calls_of_two_pools_each_use_their_own_keys(
    client: Any, pool_name: str
) -> None:
    """The library keeps each pool's key names across calls, and each call
    finds its own pool's (allocator/_scripts.py, library_text): calls of
    two pools that the server runs in turn never touch each other's keys."""
    first = FairAllocator(client, pool_name + "-1")
    second = FairAllocator(client, pool_name + "-2")
    first.extend(["a"])
    second.extend(["b", "c"])
    assert scripts().mode(client) == FUNCTIONS
    held = []
    for _ in range(3):
        for pool in (first, second, second, first):
            lease = pool.acquire(blocking=False)
            if lease is not None:
                held.append((pool, lease))
    assert sorted(lease.resource for _pool, lease in held) == ["a", "b", "c"]
    assert all((lease.resource == "a") == (pool is first) for pool, lease in held)
    assert (first.status().leased, second.status().leased) == (1, 2)
    for pool, lease in held:
        assert pool.release(lease)
    assert (first.status().free, second.status().free) == (1, 2)


@pytest.mark.parametrize("check", ["status", "gc"])
def test_kept_records_always_read_as_the_pool_holds_them(
    client: Any, pool_name: str, check: str
) -> None:
    """The library keeps the resource and lease records it saves, the
    tables themselves, and hands them to the next call that reads the same
    text (lua/prelude_resources.lua, P:res_save): a run must change a record
    only before its save. Every path that changes a record runs here, on
    the Functions path, each followed by a look through what the library
    keeps: a status read there must agree with one read on the scripts path
    (which parses every record), or gc must find nothing to repair (it
    checks each record against the lease index, FREE and PARK)."""
    pool = FairAllocator(client, pool_name)

    def look() -> None:
        if check == "gc":
            assert pool.gc().repaired == 0
            return
        scripts().enabled = False
        try:
            parsed = pool.status()
        finally:
            scripts().enabled = True
        kept = pool.status()
        assert (kept.resources, kept.leased, kept.free, kept.waiting) == (
            parsed.resources,
            parsed.leased,
            parsed.free,
            parsed.waiting,
        )

    pool.extend(["a"], capacity=2)
    pool.extend(["b"], rate=(1, 600))
    pool.extend(["c"], priority=1)
    assert scripts().mode(client) == FUNCTIONS
    look()
    grants = [pool.acquire(blocking=False) for _ in range(4)]
    # c first (priority), then a, then b ahead of a, which just went back.
    assert [x.resource for x in grants if x] == ["c", "a", "b", "a"]
    first, second, fourth, third = grants
    look()  # b's rate budget is spent: throttled
    waiter = Stepper(pool)
    queued(waiter)
    look()
    assert pool.release(first)  # c kept aside for the head, and granted to it
    waiter.run_step()  # it reads its grant
    granted = waiter.value
    assert waiter.done and granted.resource == "c"
    look()
    assert pool.release(second, quarantine=600)
    look()
    pool.quarantine("c", 600)
    look()
    assert pool.revoke(lease_id=granted.id)
    look()
    assert pool.unquarantine("c")
    look()
    pool.renew(third)
    look()
    pool.extend(["a"], capacity=3, priority=2)
    look()
    assert pool.remove(["b"]) == 1  # draining: its lease is still held
    look()
    assert pool.release(fourth)  # its last lease: it leaves
    look()
    pool.extend(["b"])
    look()
    assert pool.unquarantine("a")
    look()
    held = [pool.acquire(blocking=False) for _ in range(4)]  # all that is free
    assert sorted(x.resource for x in held if x) == ["a", "a", "b", "c"]
    assert pool.acquire(blocking=False) is None
    waiter = Stepper(pool)
    queued(waiter)
    assert pool.release(third)
    look()
    waiter.run_step()
    assert waiter.done and waiter.value.resource == "a"
    for lease in held:
        assert pool.release(lease, quarantine=1 if lease.resource == "b" else None)
    look()
