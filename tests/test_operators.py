"""Seeing and steering a pool (docs/operations.md#the-command-line), in every
flavour:
owner, leases(), stats(), quarantine(), delete(), pools(), oldest_wait, and
reads that write nothing."""

from __future__ import annotations

import math
import os
import socket
import uuid
from typing import Any

import pytest
import redis
from _workers import server_now
from helpers import Background, wait_until

from allocator import (
    AcquireTimeout,
    AllocatorError,
    AsyncFairAllocator,
    FairAllocator,
    LeaseInfo,
    LeaseLost,
    PoolStats,
    UnknownResource,
)
from allocator._core.keys import pool_names, pools_pattern
from allocator._core.replies import WAIT_BOUNDS


def keys_of(raw: Any, pool: Any) -> list[str]:
    return sorted(raw.keys(f"alloc:{{{pool.name}}}:*"))


def test_owner_is_shown_by_leases_and_defaults_to_host_and_pid(pool: Any) -> None:
    pool.extend(["a", "b", "c"])
    mine = pool.acquire(timeout=5, owner="crawler-7")
    default = pool.acquire(timeout=5)
    with pool.lease(timeout=5, owner="with | pipes") as third:
        infos = pool.leases()
        assert all(isinstance(info, LeaseInfo) for info in infos)
        by_resource = {info.resource: info for info in infos}
        assert by_resource[mine.resource].owner == "crawler-7"
        assert by_resource[default.resource].owner == f"{socket.gethostname()}:{os.getpid()}"
        assert by_resource[third.resource].owner == "with | pipes"
        info = by_resource[mine.resource]
        assert (info.token, info.granted_at, info.expires_at) == (
            mine.token,
            pytest.approx(mine.granted_at, abs=1e-6),
            pytest.approx(mine.expires_at, abs=1e-3),
        )
        # Never the lease id: it is the secret that gives power over a lease.
        assert not hasattr(info, "id") and mine.id not in repr(infos)
    assert {i.resource for i in pool.leases()} == {mine.resource, default.resource}
    pool.release(mine)
    pool.release(default)
    assert pool.leases() == ()


@pytest.mark.parametrize("owner", ["", "x" * 201, "tab\there"])
def test_bad_owner_is_refused_before_any_io(pool: Any, raw: Any, owner: str) -> None:
    with pytest.raises(ValueError, match="owner"):
        pool.acquire(timeout=1, owner=owner)
    with pytest.raises(TypeError, match="owner"):
        pool.acquire(timeout=1, owner=7)
    assert keys_of(raw, pool) == []


def test_stats_count_grants_timeouts_revocations_and_waits(pool: Any, raw: Any) -> None:
    first = pool.stats()
    assert first == PoolStats(
        name=pool.name,
        wait_seconds=tuple((b, 0) for b in (*WAIT_BOUNDS, math.inf)),
        server_time=first.server_time,
    )
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    with pytest.raises(AcquireTimeout):
        pool.acquire(timeout=0.05)
    waiter = Background(lambda: pool.acquire(timeout=10))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter")
    # It waits 30 ms at least, on the server's clock: beyond the third bucket.
    queued = server_now(raw)
    wait_until(lambda: server_now(raw) > queued + 0.03, what="30 ms of waiting")
    assert pool.release(held)
    second = waiter.join()
    assert pool.remove(["r"], force=True) == 1
    with pytest.raises(LeaseLost):
        pool.renew(second)
    stats = pool.stats()
    assert (stats.grants, stats.timeouts, stats.revoked) == (2, 1, 1)
    assert stats.wait_seconds[-1] == (math.inf, 2)
    counts = [count for _, count in stats.wait_seconds]
    assert counts == sorted(counts)  # cumulative
    # The first grant waited for nothing; the second for the waiter's wait.
    assert stats.wait_seconds[0][1] == 1 and stats.wait_seconds[2] == (WAIT_BOUNDS[2], 1)
    assert 0.03 <= stats.wait_seconds_sum < 60


def test_reclaimed_counts_an_expired_lease(pool: Any) -> None:
    pool.extend(["r"])
    pool.acquire(timeout=5, ttl=0.05)
    wait_until(lambda: pool.status().leased == 0, what="the deadline")
    assert pool.gc().reclaimed == 1
    assert pool.stats().reclaimed == 1


def test_quarantine_takes_a_resource_out_without_a_lease(pool: Any) -> None:
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    other = "b" if held.resource == "a" else "a"
    pool.quarantine(held.resource, 30)
    pool.quarantine(other, 30)
    status = pool.status()
    assert {r.state for r in status.resources} == {"quarantined"}
    assert status.free == 0 and status.leased == 1
    assert all(r.until and r.until > status.server_time + 20 for r in status.resources)
    assert pool.acquire(blocking=False) is None
    # The live lease stays valid.
    held = pool.renew(held)
    assert pool.release(held)
    assert pool.acquire(blocking=False) is None
    with pytest.raises(UnknownResource):
        pool.quarantine("nope", 1)
    with pytest.raises(ValueError, match="seconds"):
        pool.quarantine("a", 0)
    # A short quarantine ends by itself and the resource is granted again.
    pool.extend(["c"])
    pool.quarantine("c", 0.05)
    assert pool.acquire(timeout=10).resource == "c"


def test_unquarantine_puts_a_resource_back_at_once_and_serves_the_queue(pool: Any) -> None:
    pool.extend(["a"])
    pool.quarantine("a", 300)
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    assert pool.unquarantine("a") is True
    lease = waiter.join()
    assert lease.resource == "a"
    status = pool.status()
    assert (status.resources[0].state, status.resources[0].until) == ("leased", None)
    assert pool.unquarantine("a") is False  # not quarantined: nothing to end
    assert pool.release(lease, quarantine=300)  # a release's quarantine ends too
    assert pool.status().resources[0].state == "quarantined"
    assert pool.unquarantine("a") is True
    assert pool.acquire(blocking=False) is not None
    with pytest.raises(UnknownResource):
        pool.unquarantine("nope")
    with pytest.raises(TypeError, match="resource"):
        pool.unquarantine(7)


def test_unquarantine_leaves_a_rate_throttle_and_a_draining_resource(pool: Any) -> None:
    pool.extend(["t"], rate=(1, 300))
    assert pool.release(pool.acquire(timeout=5))  # its budget is spent: throttled
    assert pool.status().resources[0].throttled
    assert pool.unquarantine("t") is False
    pool.quarantine("t", 600)  # a quarantine over a spent budget...
    assert pool.unquarantine("t") is True
    row = pool.status().resources[0]  # ...ends, and the throttle goes on
    assert row.state == "quarantined" and row.throttled
    assert pool.acquire(blocking=False) is None
    pool.extend(["d"])
    held = pool.acquire(timeout=5)
    pool.remove(["d"])
    assert pool.unquarantine("d") is False
    assert next(r for r in pool.status().resources if r.name == "d").state == "draining"
    pool.release(held)


def test_close_ends_the_reader_and_the_pool_stays_usable(factory: Any, pool_name: str) -> None:
    """close() lets the client's reader end after its last waiter (its
    acknowledgements sent: the lease it delivered stays live) and returns
    its connection; the allocator works on after it, and as a context
    manager it closes at exit."""
    pool = factory.pool(pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    pool.release(held)
    pushed = waiter.join()  # delivered by the reader, acknowledged later
    # A waiter that gives up leaves the reader in its last blocking read.
    with pytest.raises(AcquireTimeout):
        pool.acquire(timeout=0.2)
    inner = getattr(pool, "inner", pool)
    pool.close()
    assert not any(_reading(reader) for reader in _readers(inner))
    assert pool.renew(pushed).token == pushed.token  # acknowledged: still its own
    assert pool.release(pushed)
    assert pool.acquire(timeout=5).resource == "r"  # usable after close()


def _readers(pool: Any) -> list[Any]:
    from allocator._async_reader import _REGISTRY as ASYNC_READERS
    from allocator._sync_reader import _REGISTRY as SYNC_READERS

    registry = SYNC_READERS if isinstance(pool, FairAllocator) else ASYNC_READERS
    return list(registry.get(pool.client, {}).values())


def _reading(reader: Any) -> bool:
    task = getattr(reader, "_task", None)
    return reader.reading if hasattr(reader, "reading") else task is not None and not task.done()


def test_allocators_are_context_managers(redis_url: str, pool_name: str) -> None:
    import asyncio

    import redis
    import redis.asyncio

    client = redis.Redis.from_url(redis_url)
    with FairAllocator(client, pool_name) as pool:
        pool.extend(["r"])
        assert pool.release(pool.acquire(timeout=5))
    client.close()

    async def scenario() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        async with AsyncFairAllocator(aclient, pool_name) as apool:
            assert await apool.release(await apool.acquire(timeout=5))
        await aclient.aclose()

    asyncio.run(scenario())


def test_quarantine_keeps_a_draining_resource_draining(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    pool.remove(["r"])
    pool.quarantine("r", 0.01)
    assert pool.status().resources[0].state == "draining"
    pool.release(held)
    assert pool.status().size == 0


def test_delete(pool: Any, raw: Any) -> None:
    assert pool.delete() is False
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    with pytest.raises(AllocatorError, match="in use"):
        pool.delete()
    assert pool.status().leased == 1
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter")
    assert pool.delete(force=True) is True
    # The waiter is turned away at once, not left to wait its 30 s; the
    # holder finds its lease gone.
    with pytest.raises(AcquireTimeout):
        waiter.join()
    with pytest.raises(LeaseLost):
        pool.renew(held)
    assert pool.release(held) is False
    wait_until(lambda: keys_of(raw, pool) == [], what="no key left")
    assert pool.delete() is False


def test_pools_lists_names_under_the_prefix_sorted(factory: Any) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    names = ["b", "a", "with {braces} and %7B", "star*"]
    for name in names:
        factory.pool(name, prefix=prefix).extend(["r"])
    factory.pool("elsewhere", prefix=prefix + "x").extend(["r"])
    pool = factory.pool("a", prefix=prefix)
    assert pool.pools(pool.client, prefix=prefix) == sorted(names)
    assert pool.pools(pool.client, prefix=prefix + "-none") == []
    pool.delete()
    assert "a" not in pool.pools(pool.client, prefix=prefix)


def test_pool_name_parsing_round_trips() -> None:
    pattern = pools_pattern("a*b")
    assert pattern == "a\\*b:{*}:*"
    keys = [b"x:{%25%7Bn%7D}:meta", "x:{plain}:q", "x:{plain}:res", "x:{bad}:s:cid", "y:{z}:meta"]
    assert pool_names(keys, "x") == ["%{n}", "plain"]


def test_oldest_wait_and_reads_of_a_missing_pool_write_nothing(pool: Any, raw: Any) -> None:
    status = pool.status()
    assert (status.size, status.waiting, status.oldest_wait, status.exists) == (0, 0, 0.0, False)
    assert pool.leases() == ()
    assert pool.stats().grants == 0
    assert keys_of(raw, pool) == []
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    assert pool.status().oldest_wait == 0.0
    waiter = Background(lambda: pool.acquire(timeout=10))
    wait_until(lambda: pool.status().oldest_wait > 0.05, what="a wait of 50 ms")
    assert pool.status().exists
    pool.release(held)
    pool.release(waiter.join())


def test_status_counts_a_lease_past_its_deadline_as_ended_without_writing(
    pool: Any, raw: Any
) -> None:
    pool.extend(["r"])
    pool.acquire(timeout=5, ttl=0.05)
    wait_until(lambda: pool.status().leased == 0, what="the deadline")
    before = {key: raw.dump(key) for key in keys_of(raw, pool)}
    status = pool.status()
    assert (status.free, status.resources[0].state) == (1, "free")
    assert pool.leases() == ()
    assert {key: raw.dump(key) for key in keys_of(raw, pool)} == before


def test_the_scripts_use_the_same_wait_buckets_as_python() -> None:
    import re
    from pathlib import Path

    prelude = (Path(__file__).resolve().parent.parent / "lua" / "prelude_resources.lua").read_text()
    body = prelude[prelude.index("function P:count_wait") :]
    body = body[: body.index("\nend\n")]
    pairs = re.findall(r"w <= (\d+) then f = 'w(\d+)'", body)
    by_field = {int(field): int(ms) for ms, field in pairs}
    assert [by_field[i] for i in range(1, len(WAIT_BOUNDS) + 1)] == [
        round(b * 1000) for b in WAIT_BOUNDS
    ]


@pytest.mark.parametrize("page", [3, 500])
def test_status_and_leases_read_a_large_pool_in_pages(
    pool: Any, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    """status() and leases() read the pool a page per script run (one run
    over 50,000 resources used to block the server for 378 ms); the
    pages add up to the same snapshot as one run, stale leases included."""
    from allocator._core import admin

    monkeypatch.setattr(admin, "PAGE", page)
    names = [f"r{i:02d}" for i in range(20)]
    pool.extend(names, capacity=2)
    pool.extend(["q"])
    pool.quarantine("q", 300)
    held = [pool.acquire(timeout=5, owner=f"o{i}") for i in range(25)]
    short = pool.acquire(timeout=5, ttl=0.001)  # past its deadline at once
    wait_until(lambda: pool.status().server_time > short.expires_at, what="the short lease ran out")
    status = pool.status()
    assert status.size == 21 and [r.name for r in status.resources] == sorted([*names, "q"])
    assert status.leased == 25  # the stale lease does not count
    by_name = {r.name: r for r in status.resources}
    assert sum(r.leases for r in by_name.values()) == 25
    assert by_name["q"].state == "quarantined"
    assert status.free == sum(1 for n in names if by_name[n].leases < 2)
    infos = pool.leases()
    assert len(infos) == 25
    assert sorted(i.token for i in infos) == sorted(lease.token for lease in held)
    assert {i.owner for i in infos} == {f"o{i}" for i in range(25)}


def test_a_damaged_record_is_one_clear_error_naming_the_pool_and_key(pool: Any, raw: Any) -> None:
    """Corrupt pool data used to give raw errors ("not enough
    values to unpack", a Lua "attempt to compare number with nil"); the
    scripts refuse it (ALLOCATOR-CORRUPT) and the library raises one
    CorruptPool naming the pool and the key; gc mends it."""
    from allocator import CorruptPool

    if not isinstance(raw, redis.Redis) or "fake" in type(raw).__module__:
        pytest.skip("a real server's scripts")
    pool.extend(["a", "b"])
    res = next(k for k in keys_of(raw, pool) if k.endswith(":res"))
    record = raw.hget(res, "a")
    raw.hset(res, "a", "zz" + record[record.index("|") :])  # its capacity damaged
    with pytest.raises(CorruptPool) as caught:
        pool.status()
    assert caught.value.pool == pool.name and caught.value.key == res
    assert "resource 'a'" in str(caught.value)
    assert pool.gc().repaired >= 1
    assert {r.name for r in pool.status().resources} == {"a", "b"}
