"""What a caller passes is checked before any I/O (docs/api.md#errors),
sync and asyncio, on every backend of the ``pool`` fixture:

- an int subclass (``IntEnum``) is taken for its plain value: before, it
  passed the checks and redis-py sent its ``repr`` (``<Size.TWO: 2>``),
  which failed on the server, after the call had started;
- an int of more than 4,300 digits raises a ``ValueError`` naming the
  argument: before, writing it into the message hit Python's int->str limit
  (``Exceeds the limit (4300 digits)``), an error that names nothing;
- nothing is written by a refused call;
- the client check refuses a client's class, a pipeline and a Sentinel
  manager at construction, saying what to pass;
- ``load_functions`` refuses an asyncio client (it returned without
  loading) and ``load_functions_async`` loads with one.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any

import attrs
import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.cluster import ClusterPipeline, RedisCluster

from allocator import AsyncFairAllocator, FairAllocator, load_functions
from allocator._scripts import load_functions_async, scripts

#: More digits than Python writes as text (sys.get_int_max_str_digits(): 4300).
HUGE = 10**5000


class Num(enum.IntEnum):
    ZERO = 0
    ONE = 1
    TWO = 2
    SIXTY = 60


def snapshot(raw: Any, name: str) -> dict[str, Any]:
    """Every key of pool ``name`` and what it holds."""
    kept: dict[str, Any] = {}
    for key in raw.keys(f"alloc:{{{name}}}*"):
        kind = raw.type(key)
        if kind == "hash":
            kept[key] = raw.hgetall(key)
        elif kind == "zset":
            kept[key] = raw.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            kept[key] = raw.lrange(key, 0, -1)
        elif kind == "stream":
            kept[key] = raw.xrange(key)
        else:
            kept[key] = (kind, raw.get(key) if kind == "string" else None)
    return kept


def prepared(pool: Any) -> Any:
    """The pool with two resources and one live lease, which it returns."""
    pool.extend(["a", "b"])
    return pool.acquire(timeout=10, ttl=30)


# (call, error, word the message must hold); ``lease`` is a live lease.
BAD: list[tuple[str, Callable[[Any, Any], Any], type, str]] = [
    ("capacity", lambda p, lease: p.extend(["x"], capacity=HUGE), ValueError, "capacity"),
    ("priority", lambda p, lease: p.extend(["x"], priority=HUGE), ValueError, "priority"),
    ("-priority", lambda p, lease: p.extend(["x"], priority=-HUGE), ValueError, "priority"),
    ("rate count", lambda p, lease: p.extend(["x"], rate=(HUGE, 1)), ValueError, "rate count"),
    ("rate secs", lambda p, lease: p.extend(["x"], rate=(1, HUGE)), ValueError, "rate seconds"),
    ("timeout", lambda p, lease: p.acquire(timeout=HUGE), ValueError, "timeout"),
    ("ttl", lambda p, lease: p.acquire(timeout=1, ttl=HUGE), ValueError, "ttl"),
    ("count", lambda p, lease: p.acquire_many(HUGE, timeout=1), ValueError, "count"),
    ("-count", lambda p, lease: p.acquire_many(-HUGE, timeout=1), ValueError, "count"),
    ("many ttl", lambda p, lease: p.acquire_many(1, timeout=1, ttl=HUGE), ValueError, "ttl"),
    ("renew ttl", lambda p, lease: p.renew(lease, ttl=HUGE), ValueError, "ttl"),
    ("quarantine", lambda p, lease: p.release(lease, quarantine=HUGE), ValueError, "quarantine"),
    ("seconds", lambda p, lease: p.quarantine("a", HUGE), ValueError, "seconds"),
    (
        "token renew",
        lambda p, lease: p.renew(attrs.evolve(lease, token=HUGE)),
        ValueError,
        "lease.token",
    ),
    (
        "token release",
        lambda p, lease: p.release(attrs.evolve(lease, token=-HUGE)),
        ValueError,
        "lease.token",
    ),
    ("lease count", lambda p, lease: p.lease_many(HUGE).__enter__(), ValueError, "count"),
    ("lease timeout", lambda p, lease: p.lease(timeout=HUGE).__enter__(), ValueError, "timeout"),
    ("capacity type", lambda p, lease: p.extend(["x"], capacity=2.0), TypeError, "capacity"),
    ("count type", lambda p, lease: p.acquire_many(True), TypeError, "count"),
]


@pytest.mark.parametrize(("what", "call", "error", "word"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_int_is_refused_naming_it_and_nothing_is_written(
    factory: Any,
    raw: Any,
    pool_name: str,
    what: str,
    call: Callable[[Any, Any], Any],
    error: type,
    word: str,
) -> None:
    pool = factory.pool(pool_name)
    lease = prepared(pool)
    before = snapshot(raw, pool_name)
    with pytest.raises(error, match=word) as caught:
        call(pool, lease)
    assert "digits" not in str(caught.value)  # not Python's int->str limit
    assert snapshot(raw, pool_name) == before
    assert pool.release(lease)


@pytest.mark.parametrize(
    ("option", "word"),
    [
        ({"lease_ttl": HUGE}, "lease_ttl"),
        ({"bind_ttl": HUGE}, "bind_ttl"),
        ({"replica_timeout": HUGE}, "replica_timeout"),
        ({"min_replicas": HUGE}, "min_replicas"),
        ({"min_replicas": -HUGE}, "min_replicas"),
        ({"min_replicas": 1.0}, "min_replicas"),
        ({"reclaim_on_disconnect": 1}, "reclaim_on_disconnect"),
        ({"reclaim_on_disconnect": "yes"}, "reclaim_on_disconnect"),
    ],
)
def test_a_bad_int_option_is_refused_at_construction(
    factory: Any, option: dict[str, Any], word: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=word) as caught:
        factory.pool("p", **option)
    assert "digits" not in str(caught.value)


def test_an_int_enum_is_taken_for_its_value(factory: Any, raw: Any, pool_name: str) -> None:
    """Every int argument given as an IntEnum does what the plain int does
    (before: capacity, the rate count, count and min_replicas reached the
    server as '<Num.TWO: 2>' and the call failed there)."""
    pool = factory.pool(pool_name, lease_ttl=Num.SIXTY, min_replicas=Num.ZERO)
    assert pool.extend(["a", "b"], capacity=Num.TWO, priority=Num.ONE, rate=(Num.TWO, Num.ONE)) == 2
    rows = {row.name: row for row in pool.status().resources}
    assert (rows["a"].capacity, rows["a"].priority) == (2, 1)
    assert type(rows["a"].capacity) is int
    first = pool.acquire(timeout=Num.TWO, ttl=Num.SIXTY)
    pair = pool.acquire_many(Num.TWO, timeout=Num.TWO, ttl=Num.SIXTY)
    assert len(pair) == 2 and len({each.resource for each in pair}) == 2
    renewed = pool.renew(first, ttl=Num.SIXTY)
    assert pool.release(attrs.evolve(renewed, token=int(renewed.token)), quarantine=Num.ZERO)
    assert all(pool.release(each) for each in pair)
    pool.quarantine("a", Num.ONE)
    # A lease's token given back as an IntEnum (a lease rebuilt by the caller).
    held = pool.acquire(timeout=Num.TWO)
    token = enum.IntEnum("Token", {"T": held.token}).T  # type: ignore[attr-defined]
    assert pool.release(attrs.evolve(held, token=token))
    # The server keeps plain numbers (no "<Num...>" text anywhere).
    assert "Num." not in repr(snapshot(raw, pool_name))


# -- the client -------------------------------------------------------------------


def wrong_clients() -> list[tuple[str, Any, str]]:
    """(what, the object, a word the error must hold)."""
    sync = redis.Redis()
    aio = redis.asyncio.Redis()
    return [
        ("the class", redis.Redis, "instance"),
        ("the asyncio class", redis.asyncio.Redis, "instance"),
        ("the cluster class", RedisCluster, "instance"),
        ("the fakeredis class", fakeredis.FakeRedis, "instance"),
        ("a pipeline", sync.pipeline(), "pipeline"),
        ("a plain pipeline", sync.pipeline(transaction=False), "pipeline"),
        ("an asyncio pipeline", aio.pipeline(), "pipeline"),
        ("a fakeredis pipeline", fakeredis.FakeRedis().pipeline(), "pipeline"),
        ("a cluster pipeline", object.__new__(ClusterPipeline), "pipeline"),
        ("an asyncio cluster pipeline", object.__new__(AsyncClusterPipeline), "pipeline"),
        ("a Sentinel", redis.sentinel.Sentinel([("127.0.0.1", 1)]), "master_for"),
        ("an asyncio Sentinel", redis.asyncio.sentinel.Sentinel([("127.0.0.1", 1)]), "master_for"),
    ]


@pytest.mark.parametrize("index", range(len(wrong_clients())), ids=[w[0] for w in wrong_clients()])
def test_no_client_but_a_client(index: int) -> None:
    """Before: each was accepted (a pipeline's status() then never
    returned, buffering its commands for ever)."""
    _what, made, word = wrong_clients()[index]
    for kind in (FairAllocator, AsyncFairAllocator):
        with pytest.raises(TypeError, match=word) as caught:
            kind(made, "p")
        assert str(caught.value).startswith("client must be")


def test_load_functions_needs_a_client_of_its_kind(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    if int(str(sync.info("server")["redis_version"]).split(".")[0]) < 7:
        sync.close()
        pytest.skip("the server has no Functions")
    name = f"allocator_{scripts().version}"

    async def run() -> None:
        aio = redis.asyncio.Redis.from_url(redis_url)
        try:
            with pytest.raises(TypeError, match="load_functions_async"):
                load_functions(aio)
            assert await load_functions_async(aio) == name
        finally:
            await aio.aclose()

    sync.function_delete(name) if sync.function_list(library=name) else None
    asyncio.run(run())
    assert sync.function_list(library=name)  # loaded by the awaitable one
    with pytest.raises(TypeError, match="load_functions"):
        asyncio.run(load_functions_async(sync))
    assert load_functions(sync) == name
    sync.close()
