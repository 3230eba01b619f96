"""The event log of a pool (``set_events``, ``allocator events``): off by
default; switched on, each grant, release, expiry, reclaim, revocation,
quarantine and dropped waiter is one entry of a capped Redis Stream, with
its resource, token, client id (and owner, for a grant) and time, never the
lease id. See the event log in docs/operations.md."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from allocator import AsyncFairAllocator, FairAllocator
from allocator.cli import main

pytestmark = pytest.mark.real_redis


@pytest.fixture
def prefix() -> str:
    return f"ev{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def events(client: redis.Redis, pool: FairAllocator) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in client.xrange(pool.events_key)
    ]


def test_off_by_default_then_every_kind_is_logged_without_the_lease_id(
    client: redis.Redis, prefix: str
) -> None:
    pool = FairAllocator(client, "web", prefix=prefix)
    pool.extend(["a", "b"])
    pool.release(pool.acquire(timeout=5))
    assert not client.exists(pool.events_key)

    pool.set_events(1000)
    held = pool.acquire(timeout=5, owner="job-1")
    pool.release(held, quarantine=0.001)
    short = pool.acquire(timeout=5, ttl=0.05)
    time.sleep(0.1)
    pool.gc()  # the expiry
    revoked = pool.acquire(timeout=5)
    assert pool.revoke(lease_id=revoked.id)
    pool.quarantine("a", 60)
    forced = pool.acquire(timeout=5)
    pool.remove([forced.resource], force=True)
    got = events(client, pool)
    assert [(e["kind"], e["resource"]) for e in got] == [
        ("grant", held.resource),
        ("release", held.resource),
        ("quarantine", held.resource),
        ("grant", short.resource),
        ("expire", short.resource),
        ("grant", revoked.resource),
        ("revoke", revoked.resource),
        ("quarantine", "a"),
        ("grant", forced.resource),
        ("revoke", forced.resource),
    ]
    assert got[0]["owner"] == "job-1" and got[0]["token"] == str(held.token)
    assert got[0]["client"] and got[1]["token"] == str(held.token)
    assert got[4]["token"] == str(short.token)
    ids = {lease.id for lease in (held, short, revoked, forced)}
    for entry in client.xrange(pool.events_key):
        assert not any(lid.encode() in value for lid in ids for value in entry[1].values())

    pool.set_events(None)
    pool.extend(["c"])
    pool.release(pool.acquire(timeout=5))
    assert len(events(client, pool)) == len(got)  # off: nothing more
    assert pool.delete(force=True)
    assert not client.exists(pool.events_key)


def test_the_log_is_capped(client: redis.Redis, prefix: str) -> None:
    pool = FairAllocator(client, "capped", prefix=prefix)
    pool.extend(["a"])
    pool.set_events(10)
    for _ in range(300):
        pool.release(pool.acquire(timeout=5))
    # MAXLEN ~ trims whole nodes of the stream (100 entries each).
    assert 10 <= client.xlen(pool.events_key) <= 110


def test_a_dropped_waiter_is_logged(client: redis.Redis, prefix: str) -> None:
    pool = FairAllocator(client, "drops", prefix=prefix)
    pool.extend(["a"])
    pool.set_events(100)
    held = pool.acquire(timeout=5)
    # The ticket of a waiter whose process is gone (no liveness mark).
    base = pool.events_key.removesuffix("events")
    entry = client.xadd(base + "q", {"l": "dead-1", "c": "dead-client", "t": "60000", "o": "job-9"})
    client.hset(base + "recs", "dead-1", "W|" + entry.decode())  # type: ignore[union-attr]
    assert pool.gc().dropped_waiters == 1
    assert events(client, pool)[-1] == {
        "kind": "drop",
        "resource": "",
        "token": "",
        "client": "dead-client",
        "owner": "job-9",
    }
    pool.release(held)


def test_bad_maxlen_is_refused_before_any_io(client: redis.Redis, prefix: str) -> None:
    pool = FairAllocator(client, "bad", prefix=prefix)
    for bad in (0, -1, 10_000_001):
        with pytest.raises(ValueError, match="maxlen"):
            pool.set_events(bad)
    for wrong in ("10", 1.5, True):
        with pytest.raises(TypeError, match="maxlen"):
            pool.set_events(wrong)  # type: ignore[arg-type]
    assert not client.keys(f"{prefix}:*")


def test_async_set_events(redis_url: str, prefix: str) -> None:
    async def go() -> list[Any]:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        pool = AsyncFairAllocator(aclient, "aio", prefix=prefix)
        await pool.extend(["a"])
        await pool.set_events(50)
        await pool.release(await pool.acquire(timeout=5))
        got = await aclient.xrange(pool.events_key)
        await aclient.aclose()
        return list(got)

    assert [e[1][b"kind"] for e in asyncio.run(go())] == [b"grant", b"release"]


def test_events_command(
    client: redis.Redis,
    prefix: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ALLOCATOR_PREFIX", prefix)
    pool = FairAllocator(client, "cli", prefix=prefix)
    pool.extend(["a", "b"])
    assert main(["events", "cli"]) == 0
    assert "is off" in capsys.readouterr().err
    assert main(["events", "cli", "--enable", "100"]) == 0
    assert "on, keeping about 100 events" in capsys.readouterr().out
    first = pool.acquire(timeout=5, owner="job-1")
    second = pool.acquire(timeout=5, owner="job-2")
    pool.release(first)
    pool.release(second)
    assert main(["events", "cli", "--resource", second.resource, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["resource"], r["token"]) for r in rows] == [
        ("grant", second.resource, second.token),
        ("release", second.resource, second.token),
    ]
    assert rows[0]["owner"] == "job-2"
    assert main(["events", "cli", "--count", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "release" in out[0] and str(second.token) in out[0]
    assert main(["events", "nope"]) == 1
    err = capsys.readouterr().err
    assert "no pool named 'nope'" in err and "Traceback" not in err
    assert main(["events", "cli", "--disable", "--follow"]) == 2
    assert main(["events", "cli", "--enable", "0"]) == 2
    assert main(["events", "cli", "--disable"]) == 0
    assert client.hget(f"{prefix}:{{cli}}:meta", "ev") is None
