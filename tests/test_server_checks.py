"""The pool defends itself from its own users where Redis lets it, on the
server.

A user whose ACL lets them run a pool's scripts can call them with any
arguments, and can write the pool's keys by hand (lua/README.md, "Trust").
Every script checks every argument it reads before its first write (a bad
one is the error reply ``ALLOCATOR-ARG <op>: <argument> <why>`` and changes
no key), and reads damaged records without a raw Lua error: it mends what it
safely can (gc saves and counts it), and replies ``ALLOCATOR-CORRUPT <key>:
<what>`` where it cannot. Each test runs on both paths: the Functions library
(``FCALL``) and the scripts (``EVALSHA``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from allocator import CorruptPool, FairAllocator, Lease, PoolStats
from allocator._core.checks import MAX_TOKEN
from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import FUNCTIONS, OPERATIONS, READ_ONLY, SCRIPTS, load_functions, scripts

pytestmark = pytest.mark.real_redis

#: Ten years in ms: the longest duration any argument may give.
MAX_MS = 315360000000


class Direct:
    """Runs a pool's operation as a user of the pool can: FCALL (FCALL_RO)
    of the library, or EVALSHA of the script."""

    def __init__(self, client: Any, path: str) -> None:
        self.client, self.path = client, path
        made = scripts()
        if path == FUNCTIONS:
            load_functions(client)
        else:
            for text in made.text.values():
                client.script_load(text)

    def __call__(self, op: str, keys: list[str], *args: Any) -> Any:
        made = scripts()
        if self.path == FUNCTIONS:
            verb = "FCALL_RO" if op in READ_ONLY else "FCALL"
            return self.client.execute_command(verb, made.function[op], len(keys), *keys, *args)
        return self.client.execute_command("EVALSHA", made.sha[op], len(keys), *keys, *args)


class Ctx:
    """A pool with resources a, b and c, one lease held (on a), a client for
    looking at its keys, and its operations called directly."""

    def __init__(self, client: Any, direct: Direct, name: str) -> None:
        self.client, self.direct, self.base = client, direct, name
        self.made = 0
        self.fresh()

    def fresh(self) -> None:
        """Start again with a new pool (each example of a hypothesis test)."""
        self.made += 1
        self.name = f"{self.base}-{self.made}"
        self.pool = FairAllocator(self.client, self.name)
        self.keys = list(self.pool._pool.keys)
        self.pool.extend(["a"], priority=1)
        self.pool.extend(["b", "c"])
        self.lease = self.pool.acquire(timeout=5)
        assert self.lease.resource == "a"

    def key(self, suffix: str) -> str:
        return self.keys[KEY_SUFFIXES.index(suffix)]

    def __call__(self, op: str, *args: Any) -> Any:
        return self.direct(op, self.keys, *args)

    def snapshot(self) -> dict[bytes, bytes]:
        """Every key of the pool (signal lists too), as DUMP has it."""
        found = self.client.scan_iter(match=f"alloc:{{{self.name}}}:*", count=1000)
        return {key: self.client.dump(key) for key in found}

    def record(self, name: str) -> list[str]:
        return str(self.client.hget(self.key("res"), name).decode()).split("|")

    def set_record(self, name: str, **fields: str) -> None:
        order = ["cap", "score", "used", "fence", "state", "until", "stamp", "rc", "rw", "rv"]
        record = dict(zip(order, self.record(name), strict=True))
        record.update(fields)
        self.client.hset(self.key("res"), name, "|".join(record[f] for f in order))

    def templates(self) -> dict[str, list[str]]:
        """Valid arguments of each operation that takes some."""
        lease = self.lease
        return {
            "acquire": ["newlid", "cid1", "60000", "5000", "1", "", "3600000", "me", "0", "", ""],
            "acquire_many": ["newlid", "cid1", "60000", "5000", "1", "2", "me", "0", "", ""],
            "poll": ["newlid", "cid1", "5000", "", "2"],
            "present": ["p.cid1"],
            "cancel": ["newlid", "1"],
            "release": [lease.id, lease.ticket, "", ""],
            "renew": [lease.id, lease.ticket, "60000"],
            "extend": ["1", "-0", "0", "0", "x"],
            "remove": ["0", "zzz"],
            "bind": ["b1", "a", "3600000"],
            "unbind": ["b1"],
            "quarantine": ["b", "1000"],
            "delete": ["0"],
            "gc": ["0", "", "0", "100"],
            "revoke": ["res", "a", ""],
            "clients": ["", "10"],
            "set_order": ["tenant", "100"],
            "set_weight": ["t1", "2.5"],
            "tenants": ["", "10"],
        }

    def cycle(self) -> None:
        """A normal acquire and release through the public allocator."""
        lease = self.pool.acquire(timeout=5)
        assert self.pool.release(lease) is True


@pytest.fixture(params=[FUNCTIONS, SCRIPTS])
def ctx(request: pytest.FixtureRequest, redis_url: str, pool_name: str) -> Iterator[Ctx]:
    client = redis.Redis.from_url(redis_url)
    path = request.param
    if path == FUNCTIONS:
        if int(str(client.info("server")["redis_version"]).split(".")[0]) < 7:
            pytest.skip("the server has no Functions")
    else:
        # The public allocator too runs the scripts.
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setattr(scripts(), "enabled", False)
    made = Ctx(client, Direct(client, path), pool_name)
    yield made
    client.close()


def refused(ctx: Ctx, op: str, args: list[Any]) -> str:
    """Call ``op`` with ``args``: it must be an error reply that changes no
    key of the pool. Returns the error's text."""
    before = ctx.snapshot()
    with pytest.raises(ResponseError) as caught:
        ctx(op, *args)
    assert ctx.snapshot() == before, f"{op} changed the pool before refusing"
    return str(caught.value)


# -- 1. every argument is checked before the first write ---------------------------


BAD_MS = ["0", "-1", "1e300", "1e3", "5.0", " 5", "0x10", "nan", "inf", "abc", "", "315360000001"]

Case = tuple[str, dict[int, str | bytes | None], str]


def case(op: str, changes: dict[int, str | bytes | None], argument: str) -> Case:
    """Operation, {argument index: bad value (None: it is missing, and so is
    every argument after it)}, and the argument the error must name."""
    return (op, changes, argument)


BAD: list[Case] = [
    case("acquire", {0: ""}, "lid"),
    case("acquire", {0: "a|b"}, "lid"),
    case("acquire", {0: "x" * 129}, "lid"),
    case("acquire", {1: ""}, "cid"),
    case("acquire", {1: "c|d"}, "cid"),
    *[case("acquire", {2: v}, "ttl_ms") for v in BAD_MS],
    case("acquire", {2: None}, "ttl_ms"),
    case("acquire", {3: "0"}, "alive_ms"),
    case("acquire", {3: "abc"}, "alive_ms"),
    case("acquire", {3: "1e300"}, "alive_ms"),
    case("acquire", {4: "2"}, "blocking"),
    case("acquire", {4: ""}, "blocking"),
    case("acquire", {5: "x" * 1025}, "bind"),
    *[case("acquire", {5: "w1", 6: v}, "bind_ttl_ms") for v in ("0", "1e300", "abc", "")],
    case("acquire", {7: ""}, "owner"),
    case("acquire", {7: "x" * 201}, "owner"),
    case("acquire", {7: None}, "owner"),
    case("acquire", {9: "x" * 513}, "info"),
    case("acquire_many", {8: "x" * 513}, "info"),
    case("acquire_many", {0: "a.b"}, "lid"),
    case("acquire_many", {1: "c|d"}, "cid"),
    case("acquire_many", {2: "1e300"}, "ttl_ms"),
    case("acquire_many", {3: "nan"}, "alive_ms"),
    case("acquire_many", {4: "x"}, "blocking"),
    *[case("acquire_many", {5: v}, "count") for v in ("0", "1001", "1.5", "-1", "")],
    case("acquire_many", {6: None}, "owner"),
    case("poll", {0: "x" * 129}, "lid"),
    case("poll", {1: "c|d"}, "cid"),
    case("poll", {2: "-5"}, "alive_ms"),
    case("present", {0: ""}, "cid"),
    case("present", {0: "p.c|d"}, "cid"),
    case("present", {0: "x" * 129}, "cid"),
    case("present", {0: None}, "cid"),
    case("poll", {3: "x" * 129}, "probe"),
    case("poll", {4: "0"}, "count"),
    case("cancel", {0: ""}, "lid"),
    case("cancel", {1: "1001"}, "count"),
    case("release", {0: ""}, "lid"),
    case("release", {0: "x" * 129}, "lid"),
    case("release", {1: ""}, "ticket"),
    case("release", {1: "1" * 65}, "ticket"),
    *[case("release", {2: v}, "quarantine_ms") for v in ("-1", "1e3", "abc", "315360000001")],
    case("release", {3: "2"}, "unclaimed"),
    case("release", {3: None}, "unclaimed"),
    case("renew", {0: ""}, "lid"),
    *[case("renew", {2: v}, "ttl_ms") for v in BAD_MS],
    *[case("extend", {0: v}, "capacity") for v in ("0", "-5", "2147483649", "1.5", "abc", "")],
    *[
        case("extend", {1: v}, "score")
        for v in ("nan", "inf", "-inf", "1e16", " 1", "0x10", "abc", "1e-400", "")
    ],
    case("extend", {1: None}, "score"),
    *[case("extend", {2: v}, "rate_count") for v in ("-1", "1000001", "1.5")],
    *[case("extend", {2: "5", 3: v}, "rate_window_ms") for v in ("0", "-1", "1e300")],
    *[case("extend", {4: v}, "resource") for v in ("", "x" * 1025, "a\x00b", "a\x01", "a\nb")],
    *[case("extend", {4: v}, "resource") for v in (b"\xff", b"a\xc3", b"\xed\xa0\x80")],
    case("remove", {0: "2"}, "force"),
    case("remove", {0: ""}, "force"),
    case("remove", {1: ""}, "resource"),
    case("remove", {1: "a\x00"}, "resource"),
    case("bind", {0: ""}, "name"),
    case("bind", {1: "a\x00"}, "resource"),
    case("bind", {2: "0"}, "bind_ttl_ms"),
    case("bind", {2: None}, "bind_ttl_ms"),
    case("unbind", {0: ""}, "name"),
    case("unbind", {0: None}, "name"),
    case("quarantine", {0: ""}, "resource"),
    *[case("quarantine", {1: v}, "ms") for v in ("0", "-5", "1e300", "abc")],
    case("delete", {0: "2"}, "force"),
    case("delete", {0: None}, "force"),
    case("revoke", {0: "x"}, "how"),
    case("revoke", {0: "id", 1: ""}, "lid"),
    case("revoke", {1: "a\x00"}, "resource"),
    case("revoke", {1: None}, "resource"),
    *[case("revoke", {2: v}, "token") for v in ("0", "-1", "abc", "1e3", "1" * 20)],
    *[case("clients", {0: v}, "cursor") for v in ("z", "a", "ax", "q1-", "a" + "1" * 16)],
    *[case("clients", {1: v}, "count") for v in ("0", "10001", "abc")],
    *[case("gc", {0: v}, "lease_cursor") for v in ("abc", "1-0", "9" * 20, "")],
    case("gc", {1: "x"}, "queue_cursor"),
    *[case("gc", {2: v}, "res_cursor") for v in ("abc", "-1", "1" * 20)],
    *[case("gc", {3: v}, "count") for v in ("0", "1001", "abc")],
    *[case("acquire", {10: v}, "tenant") for v in ("x" * 201, "a\x01", "a\nb", b"\xff")],
    *[case("acquire_many", {9: v}, "tenant") for v in ("x" * 201, "\x00", b"a\xc3")],
    *[case("set_order", {0: v}, "order") for v in ("lifo", "", "FIFO", None)],
    *[case("set_order", {1: v}, "count") for v in ("0", "1001", "abc", None)],
    *[case("set_weight", {0: v}, "tenant") for v in ("x" * 201, "a\x00", None)],
    *[
        case("set_weight", {1: v}, "weight")
        for v in ("0", "0.001", "101", "-1", "abc", "nan", "inf", "0x10", " 2", "", None)
    ],
    *[case("tenants", {0: v}, "cursor") for v in ("z", "q1-", "hx", "h" + "1" * 20)],
    *[case("tenants", {1: v}, "count") for v in ("0", "10001", "abc")],
]


@pytest.mark.parametrize(
    ("op", "changes", "argument"),
    BAD,
    ids=[f"{op}-{name}-{i}" for i, (op, _, name) in enumerate(BAD)],
)
def test_a_bad_argument_is_refused_and_nothing_is_written(
    ctx: Ctx, op: str, changes: dict[int, str | bytes | None], argument: str
) -> None:
    args: list[str | bytes | None] = list(ctx.templates()[op])
    for index, value in changes.items():
        args[index] = value
    if None in args:
        args = args[: args.index(None)]
    text = refused(ctx, op, args)
    assert text.startswith(f"ALLOCATOR-ARG {op}: {argument} "), text
    # The pool is whole: nothing half-done stands in anybody's way.
    ctx.pool.release(ctx.lease)
    ctx.cycle()


def test_what_python_accepts_the_server_accepts(ctx: Ctx) -> None:
    """The bounds are the Python side's, counted as it counts: characters,
    not bytes, and the longest ttl, capacity and priority it lets through.
    (And the arguments the bad cases start from are accepted, so that each
    of them is refused for its one bad argument.)"""
    for op, args in ctx.templates().items():
        reply = ctx(op, *args)
        assert isinstance(reply, list) and reply, (op, reply)
    ctx.fresh()
    pool = ctx.pool
    long_name = "é" * 1024  # 1024 characters, 2048 bytes
    assert pool.extend([long_name], capacity=2**31, priority=-1e15, rate=(1_000_000, 1)) == 1
    pool.extend(["z"], priority=1e15)
    pool.extend(["tiny", "whole"], priority=5e-324)
    pool.extend(["whole"], priority=10**15)
    lease = pool.acquire(timeout=5, ttl=10 * 365 * 24 * 3600.0, owner="ö" * 200, bind="ü" * 1024)
    assert lease.resource == "z"
    assert pool.renew(lease, ttl=10 * 365 * 24 * 3600.0).resource == "z"
    pool.quarantine(long_name, 10 * 365 * 24 * 3600.0)
    assert pool.release(lease, quarantine=0) is True
    assert pool.release(ctx.lease, quarantine=10 * 365 * 24 * 3600.0) is True
    fields = ctx.client.hgetall(ctx.key("stats"))
    assert int(fields[b"qr"]) == 2 and int(fields[b"qo"]) == 1


# -- 2. damaged records: mended, or ALLOCATOR-CORRUPT naming the key ---------------------


def assert_corrupt(error: pytest.ExceptionInfo[Exception], key: str, *words: str) -> None:
    """The refusal of a script called directly (ResponseError) or through
    the library (CorruptPool, naming the pool and the key)."""
    if isinstance(error.value, CorruptPool):
        assert error.value.key == key, error.value
        text = error.value.detail
    else:
        text = str(error.value)
        assert text.startswith(f"ALLOCATOR-CORRUPT {key}: "), text
    for word in words:
        assert word in text, text


def test_damaged_times_and_hint_in_meta_are_read_safely(ctx: Ctx) -> None:
    """Before: 'attempt to compare nil with number' from every acquire."""
    meta = ctx.key("meta")
    ctx.client.hset(meta, mapping={"nd": "garbage", "nh": "1e999", "hint": "x@1"})
    ctx.client.hdel(meta, "hintkey", "hintmsg")
    ctx.cycle()
    ctx.client.hset(meta, mapping={"nd": "garbage", "hint": "x@1"})
    report = ctx.pool.gc()
    assert report.repaired >= 2
    assert ctx.client.hget(meta, "hint") is None
    assert float(ctx.client.hget(meta, "nd")) > 0
    ctx.cycle()


def as_an_earlier_version_left_it(ctx: Ctx, lease: Lease) -> Lease:
    """``lease`` as an earlier version kept it: its ticket in the queue for
    as long as the lease (a new entry, which its record names), and META
    `ld`, the last ticket granted in queue order, with the order's `|<ticket>`."""
    ticket = ctx.client.xadd(ctx.key("q"), {"l": lease.id, "c": "cid-old", "t": "60000", "o": "me"})
    text = ctx.client.hget(ctx.key("recs"), lease.id)
    ctx.client.hset(ctx.key("recs"), lease.id, text.replace(lease.ticket.encode(), ticket, 1))
    ctx.client.hset(ctx.key("meta"), mapping={"ld": ticket, "ord": b"|" + ticket})
    return attrs.evolve(lease, ticket=ticket.decode())


def test_a_queue_an_earlier_version_left_serves_its_waiters_only(ctx: Ctx) -> None:
    """An earlier version kept a lease's ticket in the queue for as long as
    the lease: the queue's head is its first waiting request, the lease's
    ticket at the head is dropped (an orphan, not a waiter) and its lease
    left alone; gc removes what the earlier version kept in META."""
    ctx.pool.remove(["c"])
    other = ctx.pool.acquire(timeout=5)
    assert other.resource == "b"
    old = as_an_earlier_version_left_it(ctx, other)
    assert ctx("acquire", "w1", "cidw", "60000", "60000", "1", "", "3600000", "me")[0] == b"queued"
    assert ctx.pool.release(ctx.lease) is True  # and serves the waiter, not the lease's ticket
    assert ctx.client.hget(ctx.key("recs"), "w1").startswith(b"L|")
    assert ctx.client.xlen(ctx.key("q")) == 0
    assert ctx.pool.stats().dropped_waiters == 0
    assert ctx.pool.renew(old).ticket == old.ticket  # the old lease lives on
    assert ctx.pool.gc().orphans == 0
    assert ctx.client.hmget(ctx.key("meta"), "ld", "ord") == [None, None]
    assert ctx.pool.release(old) is True
    assert ctx("cancel", "w1", "1") == [b"released"]
    ctx.cycle()


def test_damaged_counters_never_stop_a_grant(ctx: Ctx) -> None:
    """Counters that hold no integer: before, HINCRBY failed half-way
    through a grant, and stats() raised ValueError. Now they start again;
    stats() leaves them out until then; gc removes them."""
    stats, meta = ctx.key("stats"), ctx.key("meta")
    ctx.client.hset(stats, mapping={"w1": "abc", "ws": "x", "timeouts": "9" * 30})
    ctx.client.hset(meta, mapping={"bhit": "x", "bmiss": "y", "xw": "z", "wseq": "w"})
    assert ctx.pool.stats().timeouts == 0
    status = ctx.pool.status()
    assert (status.bind_hits, status.bind_misses) == (0, 0)
    lease = ctx.pool.acquire(timeout=5, bind="w")
    assert ctx.pool.release(lease)
    assert ctx.pool.gc().repaired >= 4
    for key, field in ((stats, "timeouts"), (meta, "xw"), (meta, "wseq"), (meta, "bhit")):
        value = ctx.client.hget(key, field)
        assert value is None or int(value) < 10**19, (field, value)
    assert ctx.pool.stats().grants >= 1
    ctx.cycle()


def test_a_damaged_resource_record_is_mended(ctx: Ctx) -> None:
    """A record whose fields are not what the scripts write: status says so
    (before: 'ValueError: invalid literal for int()' from status(), a raw
    Lua error from acquire); gc mends it safely (capacity 1, priority 0)
    and counts it; so does the grant path, as it meets one."""
    ctx.pool.extend(["b"], capacity=3, priority=5)
    fence = ctx.record("b")[3]
    ctx.client.hset(ctx.key("res"), "b", f"x|zz|0|{fence}|z|0||0|0|0")
    with pytest.raises(CorruptPool) as error:
        ctx.pool.status()
    assert_corrupt(error, ctx.key("res"), "'b'", "malformed")
    assert ctx.pool.gc().repaired >= 1
    rows = {row.name: row for row in ctx.pool.status().resources}
    assert (rows["b"].capacity, rows["b"].priority, rows["b"].state) == (1, 0.0, "free")
    fence = ctx.record("c")[3]
    ctx.client.hset(ctx.key("res"), "c", f"x|abc|7|{fence}|?|x||y|0|0")
    held = [ctx.pool.acquire(timeout=5) for _ in range(2)]
    assert sorted(lease.resource for lease in held) == ["b", "c"]
    assert ctx.pool.acquire(blocking=False) is None  # each mended to capacity 1
    assert all(ctx.pool.release(lease) for lease in held)
    ctx.pool.status()


@pytest.mark.parametrize("fence", [str(MAX_TOKEN), "99999999999999999999999", "abc", ""])
def test_a_fence_that_cannot_grow_is_never_granted(ctx: Ctx, fence: str) -> None:
    """Before, a fence of 2^63-1 gave a lease with token 2^63, which the
    library's own release refused (ValueError). Now the resource is never
    granted: out of rotation; status and gc report it."""
    ctx.pool.remove(["b", "c"])
    assert ctx.pool.release(ctx.lease)
    ctx.set_record("a", fence=fence)
    assert ctx.pool.acquire(blocking=False) is None
    assert ctx.client.zcard(ctx.key("free")) == 0
    for call in (ctx.pool.status, ctx.pool.gc):
        with pytest.raises(CorruptPool) as error:
            call()
        assert_corrupt(error, ctx.key("res"), "'a'", "fence cannot grow")
    ctx.pool.extend(["d"])
    lease = ctx.pool.acquire(timeout=5)
    assert lease.resource == "d" and 0 < lease.token <= MAX_TOKEN
    assert ctx.pool.release(lease)


def test_the_last_token_a_fence_can_give_is_given_once(ctx: Ctx) -> None:
    """Tokens stay below 2^53, where Lua's numbers are exact: the fence
    2^53 - 1 gives 2^53 once, then the resource is stuck. Before, the next
    grant repeated 2^53 (2^53 + 1 is no double)."""
    ctx.pool.remove(["b", "c"])
    assert ctx.pool.release(ctx.lease)
    ctx.set_record("a", fence=str(2**53 - 1))
    first = ctx.pool.acquire(timeout=5)
    assert first.token == 2**53
    assert ctx.pool.release(first)
    assert ctx.pool.acquire(blocking=False) is None
    with pytest.raises(CorruptPool) as error:
        ctx.pool.status()
    assert_corrupt(error, ctx.key("res"), "'a'", "fence cannot grow")


def test_a_damaged_last_token_of_a_removed_resource_is_refused(ctx: Ctx) -> None:
    """A resource that comes back continues from its last token in GONE; one
    that is not a token is refused, and nothing is written."""
    ctx.pool.remove(["b"])
    ctx.client.hset(ctx.key("gone"), "b", "abc")
    text = refused(ctx, "extend", ["1", "0", "0", "0", "b"])
    assert text.startswith(f"ALLOCATOR-CORRUPT {ctx.key('gone')}: "), text
    assert "'b'" in text


def test_a_damaged_lease_record(ctx: Ctx) -> None:
    """Its holder's release and renew are told (before: release said False,
    as if the lease had ended); others are served; gc removes it and frees
    its resource."""
    ctx.client.hset(ctx.key("recs"), ctx.lease.id, "L|garbage")
    for call in (ctx.pool.release, ctx.pool.renew):
        with pytest.raises(CorruptPool) as error:
            call(ctx.lease)
        assert_corrupt(error, ctx.key("recs"), "malformed")
    with pytest.raises(CorruptPool) as error:
        ctx.pool.leases()
    assert_corrupt(error, ctx.key("recs"))
    ctx.cycle()
    assert ctx.pool.gc().repaired >= 2  # the record, and the resource's count
    assert ctx.client.hget(ctx.key("recs"), ctx.lease.id) is None
    assert ctx.pool.leases() == ()
    held = [ctx.pool.acquire(timeout=5) for _ in range(3)]
    assert {lease.resource for lease in held} == {"a", "b", "c"}


def test_a_damaged_waiting_record(ctx: Ctx) -> None:
    """A waiter whose record is damaged is told at its next look, its
    cancel and its retry (before: 'Invalid stream ID'); nothing is written."""
    ctx.pool.remove(["b", "c"])
    assert ctx("acquire", "w1", "cidw", "60000", "5000", "1", "", "3600000", "me")[0] == b"queued"
    ctx.client.hset(ctx.key("recs"), "w1", "W|garbage")
    for op, args in (
        ("poll", ["w1", "cidw", "5000"]),
        ("cancel", ["w1", "1"]),
        ("acquire", ["w1", "cidw", "60000", "5000", "1", "", "3600000", "me"]),
    ):
        before = ctx.snapshot()
        with pytest.raises(ResponseError) as error:
            ctx(op, *args)
        assert_corrupt(error, ctx.key("recs"), "malformed")
        if op != "poll":  # a look refreshes its liveness mark first
            assert ctx.snapshot() == before


def test_forged_queue_entries_are_dropped(ctx: Ctx) -> None:
    """Entries added to the queue by hand, without what a grant reads: the
    queue passes them by. Before: a raw Lua error from every release."""
    q = ctx.key("q")
    ctx.pool.remove(["b", "c"])
    for fields in (
        {"l": "f1"},
        {"c": "f2"},
        {"l": "f3", "c": "c3", "t": "1e400"},
        {"l": "f4", "c": "c4", "t": "abc"},
        {"l": "f5", "c": "c5", "t": "1000", "n": "0"},
        {"l": "f6", "c": "c6", "t": "1000", "b": "x", "B": "nan"},
        {"l": "f7", "c": "c7", "x": "2"},
    ):
        ctx.client.xadd(q, fields)
    assert ctx("acquire", "w1", "cidw", "60000", "60000", "1", "", "3600000", "me")[0] == b"queued"
    assert ctx.pool.release(ctx.lease) is True
    assert ctx.client.hget(ctx.key("recs"), "w1").startswith(b"L|")
    assert ctx.client.xlen(q) == 0  # the waiter's ticket left the queue at its grant
    assert ctx.pool.stats().dropped_waiters == 7
    assert ctx("cancel", "w1", "1") == [b"released"]
    ctx.cycle()


def test_forged_free_entries_grant_nothing(ctx: Ctx) -> None:
    """Entries of FREE that name no free resource: passed by, and removed.
    Before: a raw Lua error (a resource not in the pool), or a grant past
    the capacity (a full one)."""
    free = ctx.key("free")
    ctx.client.zadd(free, {"00000000000000ghost": -1e15, "00000000000000a": -1e15})
    lease = ctx.pool.acquire(blocking=False)
    assert lease is not None and lease.resource in ("b", "c")
    assert ctx.client.zscore(free, "00000000000000ghost") is None
    ctx.client.zadd(free, {"00000000000000ghost": -1e15, "00000000000000a": -1e15})
    other = ctx.pool.acquire_many(1, blocking=False)
    assert other is not None and {x.resource for x in other} <= {"b", "c"}
    assert ctx.pool.acquire(blocking=False) is None
    rows = {row.name: row for row in ctx.pool.status().resources}
    assert all(row.leases <= row.capacity for row in rows.values())
    assert ctx.client.zcard(free) == 0


def test_a_forged_free_head_met_by_an_uncontended_acquire_is_passed_in_the_same_run(
    ctx: Ctx,
) -> None:
    """Nobody waits, and the first member of FREE names no free resource: the
    acquire that would be granted in its own run (its ticket trimmed as it
    is added) finds that out before adding its ticket, so the ticket joins
    the queue as any other and is served from the next member. Wrong: a
    ticket trimmed for a grant that did not happen, a waiter whose ticket
    is not in the queue."""
    free, q = ctx.key("free"), ctx.key("q")
    ctx.client.zadd(free, {"00000000000000ghost": -1e15})
    reply = ctx("acquire", "w1", "cidw", "60000", "60000", "1", "", "3600000", "me")
    assert reply[0] == b"granted" and reply[6] in (b"b", b"c")  # in this one run
    assert ctx.client.zscore(free, "00000000000000ghost") is None
    assert ctx.client.xlen(q) == 0  # served: its ticket left the queue
    assert ctx.client.hget(ctx.key("recs"), "w1").startswith(b"L|" + reply[1])
    assert ctx("release", "w1", reply[1].decode(), "", "") == [b"released"]
    ctx.cycle()


def test_forged_rate_log_entries_are_dropped(ctx: Ctx) -> None:
    """An entry of the rate log with no grant time in it. Before: a raw Lua
    error from the grant that met it."""
    ctx.pool.remove(["b", "c"])
    assert ctx.pool.release(ctx.lease)
    ctx.pool.extend(["a"], rate=(2, 60))
    ctx.cycle()
    seconds, micros = ctx.client.time()
    now_us = seconds * 1_000_000 + micros
    # Inside the window and before the real entry, but no hex number.
    stamp = format(now_us - 30_000_000, "014x")[:13] + "g"
    ctx.client.zadd(ctx.key("rlog"), {f"a\x00{stamp}00000000000001": 0})
    lease = ctx.pool.acquire(timeout=5)
    assert lease.resource == "a" and ctx.pool.release(lease)
    assert ctx.client.zrangebylex(ctx.key("rlog"), "[a\x00", "(a\x01") != []
    assert all(b"g" not in m for m in ctx.client.zrange(ctx.key("rlog"), 0, -1))
    row = ctx.pool.status().resources[0]
    assert row.throttled  # its budget of 2 is spent


def test_forged_index_entries_are_removed_by_gc(ctx: Ctx) -> None:
    """An entry of the index of live leases that names no lease. Before, gc
    counted it as a lease: the resource stayed full for ever."""
    ctx.client.zadd(ctx.key("held"), {"b\x00ghost": 0})
    assert ctx.pool.gc().repaired == 1
    assert ctx.client.zrangebylex(ctx.key("held"), "[b\x00", "(b\x01") == []
    held = [ctx.pool.acquire(timeout=5) for _ in range(2)]
    assert {lease.resource for lease in held} == {"b", "c"}


def test_a_key_of_another_type_is_reported_by_gc(ctx: Ctx) -> None:
    ctx.client.delete(ctx.key("stats"))
    ctx.client.set(ctx.key("stats"), "x")
    text = refused(ctx, "gc", ["0", "", "0", "100"])
    assert text.startswith(f"ALLOCATOR-CORRUPT {ctx.key('stats')}: a string, not a hash"), text


# -- 3. quarantines counted by cause -------------------------------------------------


def test_quarantines_are_counted_by_cause(ctx: Ctx) -> None:
    """STATS `qr` (started by a release with quarantine=) and `qo` (by an
    operator's quarantine()), for the metrics' ``allocator_quarantines_total``; a release without
    quarantine, or of a lease that had ended, counts nothing."""
    stats = ctx.key("stats")
    lease = ctx.pool.acquire(timeout=5)
    assert ctx.pool.release(lease) is True
    assert ctx.pool.release(ctx.lease, quarantine=60) is True
    assert ctx.pool.release(ctx.lease, quarantine=60) is False
    ctx.pool.quarantine("b", 60)
    ctx.pool.quarantine("c", 60)
    assert ctx.client.hget(stats, "qr") == b"1"
    assert ctx.client.hget(stats, "qo") == b"2"
    assert PoolStats(name="x").quarantined_on_release == 0
    assert PoolStats(name="x").quarantined_by_operator == 0


# -- 4. garbage at every operation ----------------------------------------------------

SAMPLES = [
    "", "0", "1", "2", "-1", "1e300", "1e3", "5.0", " 5", "0x10", "nan", "inf", "-inf",
    "315360000000", "315360000001", "2147483648", "2147483649", "1000", "1001", "1000000",
    "0-0", "1-1", "99999999999999999999-0", "18446744073709551615-18446744073709551615",
    "a|b", "a.b", "x" * 129, "é" * 201, "\x00", "\n", "a", "b", "newlid", "cid1", "-0", "1e-400",
    "9223372036854775807",
]  # fmt: skip

garbage = st.one_of(
    st.sampled_from(SAMPLES),
    st.text(max_size=12),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats().map(repr),
    st.binary(max_size=8),
)

#: A call: an operation, and either its template with some arguments
#: replaced (and perhaps cut short), or arguments that are all garbage.
calls = st.tuples(
    st.sampled_from(OPERATIONS),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 8), garbage), max_size=3),
    st.one_of(st.none(), st.integers(0, 8)),
    st.lists(garbage, max_size=9),
)


def granted_resources(reply: Any) -> list[bytes]:
    if isinstance(reply, list) and reply and reply[0] == b"granted":
        return [reply[6]]
    if isinstance(reply, list) and reply and reply[0] == b"granted_many":
        return [reply[i] for i in range(6, len(reply), 6)]
    return []


@pytest.mark.slow  # 120 random plans on each path: about a minute each
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(calls, min_size=1, max_size=4))
def test_garbage_arguments_never_break_the_pool(ctx: Ctx, plan: list[Any]) -> None:
    """Whatever the arguments: a normal reply or an ALLOCATOR-ARG error
    (ALLOCATOR-CORRUPT only for damaged data, which arguments cannot make),
    never any other error; a grant never takes a resource past its
    capacity; afterwards nothing needs repair, and the pool serves."""
    ctx.fresh()
    templates = ctx.templates()
    waiters: list[tuple[Any, Any]] = []
    for op, from_template, changes, cut, noise in plan:
        args: list[Any] = list(noise)
        if from_template and op in templates:
            args = list(templates[op])
            for index, value in changes:
                if index < len(args):
                    args[index] = value
            if cut is not None:
                args = args[:cut]
        try:
            reply = ctx(op, *args)
        except ResponseError as exc:
            assert str(exc).startswith("ALLOCATOR-ARG "), (op, args, str(exc))
            event(f"{op}: refused")
            continue
        event(f"{op}: {reply[0]!r}")
        if op in ("acquire", "acquire_many"):
            waiters.append((args[0], args[5] if op == "acquire_many" else "1"))
        for resource in granted_resources(reply):
            record = ctx.client.hget(ctx.key("res"), resource).decode().split("|")
            assert int(record[2]) <= int(record[0]), (op, args, record)
    # Waiters that the garbage queued leave (they would hold the line).
    for lid, count in waiters:
        ctx("cancel", lid, count)
    assert ctx.pool.gc().repaired == 0
    ctx.pool.status()
    ctx.pool.leases()
    ctx.pool.stats()
    ctx.pool.clients()
    ctx.pool.extend(["probe"])
    lease = ctx.pool.acquire(timeout=5)
    assert isinstance(lease, Lease) and ctx.pool.release(lease) is True
