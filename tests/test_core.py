"""The I/O-free core, the public surface, and the package: no Redis needed."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import attrs
import fakeredis
import pytest
import redis
from fakeredis.commands_mixins import server_mixin
from redis.cluster import key_slot

import allocator
from allocator import (
    AcquireTimeout,
    AllocatorError,
    AsyncFairAllocator,
    FairAllocator,
    GCReport,
    Lease,
    LeaseLost,
    PoolStatus,
    UnknownResource,
)
from allocator._core.keys import _escape
from allocator._core.liveness import HEARTBEAT
from allocator._core.messages import target
from allocator._core.pool import Pool
from allocator._core.presence import HEARTBEAT_PRESENT
from allocator._core.reader import Reader
from allocator._core.replies import _tagged
from allocator._scripts import OPERATIONS, PRELUDE, load_scripts
from allocator._transport import heartbeat_for

ROOT = Path(__file__).resolve().parent.parent


class Recorder:
    """A client that fails the test on any command: validation comes first.
    (Reading its settings is no I/O; calling any method is.)"""

    connection_pool = None

    def __getattr__(self, name: str) -> Any:
        def command(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"the library sent {name} before rejecting its arguments")

        return command


class AsyncRecorder(Recorder):
    """The same, for an asyncio allocator: its commands are coroutines."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the library sent a command before rejecting its arguments")


@pytest.fixture
def offline() -> FairAllocator:
    return FairAllocator(Recorder(), "p")


def lease_of(pool: str = "p") -> Lease:
    return Lease(
        resource="r", token=1, id="x" * 22, ticket="1-0", expires_at=2.0, ttl=1.0,
        granted_at=1.0, pool=pool,
    )  # fmt: skip


# -- construction ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "word"),
    [
        ({"name": ""}, ValueError, "name"),
        ({"name": "x" * 201}, ValueError, "name"),
        ({"name": 5}, TypeError, "name"),
        ({"name": "a\nb"}, ValueError, "name"),
        ({"prefix": ""}, ValueError, "prefix"),
        ({"prefix": b"x"}, TypeError, "prefix"),
        ({"lease_ttl": 0}, ValueError, "lease_ttl"),
        ({"lease_ttl": -1}, ValueError, "lease_ttl"),
        ({"lease_ttl": math.nan}, ValueError, "lease_ttl"),
        ({"lease_ttl": "60"}, TypeError, "lease_ttl"),
        ({"lease_ttl": True}, TypeError, "lease_ttl"),
        ({"bind_ttl": math.inf}, ValueError, "bind_ttl"),
    ],
)
def test_construction_rejects_bad_arguments(kwargs: dict[str, Any], error: type, word: str) -> None:
    args = {"name": "p", **kwargs}
    name = args.pop("name")
    with pytest.raises(error, match=word):
        FairAllocator(Recorder(), name, **args)
    with pytest.raises(error, match=word):
        AsyncFairAllocator(AsyncRecorder(), name, **args)


def test_construction_does_no_io() -> None:
    FairAllocator(Recorder(), "any name {with} braces ✓", lease_ttl=0.5, prefix="x{y}")
    AsyncFairAllocator(AsyncRecorder(), "p")


# -- arguments of every operation, checked before any I/O ---------------------


@pytest.mark.parametrize(
    ("call", "error", "word"),
    [
        (lambda p: p.acquire(timeout=-1), ValueError, "timeout"),
        (lambda p: p.acquire(timeout="1"), TypeError, "timeout"),
        (lambda p: p.acquire(timeout=math.nan), ValueError, "timeout"),
        (lambda p: p.acquire(ttl=0), ValueError, "ttl"),
        (lambda p: p.acquire(ttl=-5), ValueError, "ttl"),
        (lambda p: p.acquire(ttl=1e12), ValueError, "ttl"),
        (lambda p: p.acquire(bind=""), ValueError, "bind"),
        (lambda p: p.acquire(bind=7), TypeError, "bind"),
        (lambda p: p.acquire(bind="x" * 2000), ValueError, "bind"),
        (lambda p: p.acquire(blocking=1), TypeError, "blocking"),
        (lambda p: p.release("not a lease"), TypeError, "lease"),
        (lambda p: p.release(lease_of("other")), ValueError, "lease"),
        (lambda p: p.release(lease_of(), quarantine=-1), ValueError, "quarantine"),
        (lambda p: p.renew(lease_of(), ttl=0), ValueError, "ttl"),
        (lambda p: p.renew(None), TypeError, "lease"),
        (lambda p: p.extend("abc"), TypeError, "resources"),
        (lambda p: p.extend(5), TypeError, "resources"),
        (lambda p: p.extend(["a", None]), TypeError, "resources"),
        (lambda p: p.extend(["a", ""]), ValueError, "resources"),
        (lambda p: p.extend(["a\x00b"]), ValueError, "resources"),
        (lambda p: p.extend(["x" * 1025]), ValueError, "resources"),
        (lambda p: p.extend(["a"], capacity=0), ValueError, "capacity"),
        (lambda p: p.extend(["a"], capacity=1.5), TypeError, "capacity"),
        (lambda p: p.extend(["a"], capacity=True), TypeError, "capacity"),
        (lambda p: p.extend(["a"], priority="high"), TypeError, "priority"),
        (lambda p: p.extend(["a"], priority=math.inf), ValueError, "priority"),
        (lambda p: p.extend(["a"], rate=5), TypeError, "rate"),
        (lambda p: p.extend(["a"], rate=(0, 1)), ValueError, "rate"),
        (lambda p: p.extend(["a"], rate=(1.5, 1)), TypeError, "rate"),
        (lambda p: p.extend(["a"], rate=(5, 0)), ValueError, "rate"),
        (lambda p: p.remove("abc"), TypeError, "resources"),
        (lambda p: p.remove(["a"], force="yes"), TypeError, "force"),
        (lambda p: p.bind("", "r"), ValueError, "name"),
        (lambda p: p.bind("w", 3), TypeError, "resource"),
        (lambda p: p.unbind(None), TypeError, "name"),
        (lambda p: p.lease(keepalive="yes").__enter__(), TypeError, "keepalive"),
        (lambda p: p.acquire_many(0), ValueError, "count"),
        (lambda p: p.acquire_many(-2), ValueError, "count"),
        (lambda p: p.acquire_many(10**9), ValueError, "count"),
        (lambda p: p.acquire_many(2.0), TypeError, "count"),
        (lambda p: p.acquire_many(True), TypeError, "count"),
        (lambda p: p.acquire_many("2"), TypeError, "count"),
        (lambda p: p.acquire_many(None), TypeError, "count"),
        (lambda p: p.acquire_many(2, timeout=-1), ValueError, "timeout"),
        (lambda p: p.acquire_many(2, ttl=0), ValueError, "ttl"),
        (lambda p: p.acquire_many(2, blocking=1), TypeError, "blocking"),
        (lambda p: p.acquire_many(2, owner=""), ValueError, "owner"),
        (lambda p: p.acquire_many(2, owner=5), TypeError, "owner"),
        (lambda p: p.lease_many(0).__enter__(), ValueError, "count"),
        (lambda p: p.lease_many(2, keepalive=1).__enter__(), TypeError, "keepalive"),
    ],
)
def test_bad_arguments_raise_before_io(
    offline: FairAllocator, call: Any, error: type, word: str
) -> None:
    with pytest.raises(error, match=word):
        call(offline)


def test_errors_mix_in_the_builtins() -> None:
    timeout = AcquireTimeout("p", 1.5)
    assert isinstance(timeout, TimeoutError) and isinstance(timeout, AllocatorError)
    assert (timeout.pool, timeout.waited) == ("p", 1.5)
    unknown = UnknownResource("p", "r")
    assert isinstance(unknown, KeyError) and "'r'" in str(unknown)
    lost = LeaseLost("p", "r", 7)
    assert isinstance(lost, AllocatorError) and lost.token == 7


def test_lease_repr_hides_its_secret() -> None:
    lease = lease_of()
    assert lease.id not in repr(lease)
    with pytest.raises(AttributeError):
        lease.token = 2  # type: ignore[misc]


# -- keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["plain", "a{b}c", "}{", "{x}", "{", "}", "%7B", "прокси ✓", "x" * 200, "a:b c"]
)
@pytest.mark.parametrize("prefix", ["alloc", "{p}", "a%b"])
def test_a_pool_lives_in_one_cluster_slot(name: str, prefix: str) -> None:
    pool = Pool.create(name, lease_ttl=60, bind_ttl=60, prefix=prefix)
    keys = [*pool.keys, pool.signal_key("some-client-id")]
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_names_that_escape_alike_do_not_collide() -> None:
    names = ["a{b}c", "a%7Bb%7Dc", "a%257Bb", "a{b", "a%7Bb"]
    keysets = {Pool.create(n, lease_ttl=1, bind_ttl=1, prefix="p").keys for n in names}
    assert len(keysets) == len(names)
    assert _escape("%{}") == "%25%7B%7D"


# -- replies ---------------------------------------------------------------------


@pytest.mark.parametrize("reply", [None, [], "granted", 5, [b"surprise"]])
def test_unexpected_replies_raise(reply: Any) -> None:
    pool = Pool.create("p", lease_ttl=1, bind_ttl=1, prefix="a")
    with pytest.raises(AllocatorError, match="unexpected"):
        pool._state("acquire", "lid", reply)


def test_replies_parse_as_bytes_or_text() -> None:
    pool = Pool.create("p", lease_ttl=1, bind_ttl=1, prefix="a")
    raw = [
        b"granted",
        b"5-1",
        b"1795357126155123",
        b"1795357126155123",
        1795357186155,
        b"60000",
        "ключ".encode(),
    ]
    text = [x.decode() if isinstance(x, bytes) else x for x in raw]
    for reply in (raw, text):
        lease = pool._state("acquire", "lid", reply)
        assert isinstance(lease, Lease)
        assert (lease.resource, lease.token, lease.ticket, lease.ttl) == (
            "ключ",
            1795357126155123,
            "5-1",
            60.0,
        )
    assert _tagged("x", [b"queued", b"1-1", b"-1"]) == ("queued", [b"1-1", b"-1"])


def test_messages() -> None:
    pool = Pool.create("p", lease_ttl=1, bind_ttl=1, prefix="a")
    grant = "g|lid|5-1|1795357126155123|1795357126155123|60000|r|with|pipes"
    lease = pool._message(grant.encode(), "lid", "5-1")
    assert isinstance(lease, Lease) and lease.resource == "r|with|pipes"
    assert lease.expires_at == (1795357126155 + 60000) / 1000
    assert pool._message(grant, "lid", "4-1") is None  # another ticket: stale
    assert pool._message(grant, "other", "5-1") is None
    assert pool._message("h|lid|250", "lid", "5-1") == 0.25
    assert pool._message("garbage", "lid", "5-1") is None
    assert target("garbage") == ""
    assert pool.release_message("h|lid|5") is None
    assert pool.release_message(grant) is not None


def test_the_first_round_after_a_failure_is_a_heartbeat() -> None:
    """A restart or a failover drops every presence: the reader beats (and
    so subscribes again) as soon as the server answers, not up to a
    heartbeat later, which left a waiter absent past its grace now and
    then (test_recovery's appendonly restart lost a place)."""
    hub = Reader(HEARTBEAT)
    assert hub.beat_in(100.0) == HEARTBEAT
    hub.beaten(100.0, [])
    assert hub.beat_in(100.1) > 0
    hub.failed(redis.exceptions.ConnectionError("Connection refused"))
    assert hub.beat_in(100.2) <= 0
    hub.beaten(100.3, [])
    assert hub.beat_in(100.4) > 0


def test_heartbeat_stays_under_the_socket_timeout() -> None:
    assert heartbeat_for(redis.Redis(socket_timeout=0.5)) == 0.25
    assert heartbeat_for(redis.Redis(socket_timeout=None)) == HEARTBEAT_PRESENT
    assert heartbeat_for(redis.Redis(socket_timeout=30)) == HEARTBEAT_PRESENT


def test_a_client_that_keeps_a_presence_beats_rarely() -> None:
    """Waiting costs a client that keeps a presence a heartbeat every
    HEARTBEAT_PRESENT seconds; one judged by its mark alone beats every
    HEARTBEAT, and a reader serving both beats for the one that needs it."""
    hub = Reader(HEARTBEAT_PRESENT)
    present = Pool.create("a", lease_ttl=60, bind_ttl=60, prefix="alloc")
    plain = Pool.create("b", lease_ttl=60, bind_ttl=60, prefix="alloc")
    hub.presences.decide(present, True)
    hub.presences.decide(plain, False)
    hub.register(present, "l1", None)
    assert hub.interval() == HEARTBEAT_PRESENT
    hub.register(plain, "l2", None)
    assert hub.interval() == HEARTBEAT
    hub.unregister("l2")
    assert hub.interval() == HEARTBEAT_PRESENT


# -- the public surface ----------------------------------------------------------


def test_import_surface() -> None:
    expected = {
        "FairAllocator", "AsyncFairAllocator", "Lease", "PoolStatus", "GCReport",
        "AllocatorError", "AcquireTimeout", "LeaseLost", "UnknownResource",
    }  # fmt: skip
    assert expected <= set(allocator.__all__)
    for name in allocator.__all__:
        assert getattr(allocator, name)
    report_fields = {a.name for a in attrs.fields(GCReport)}
    assert {"reclaimed", "dropped_waiters", "expired_bindings"} <= report_fields
    status_fields = {a.name for a in attrs.fields(PoolStatus)}
    assert {"size", "free", "leased", "waiting", "resources"} <= status_fields


def public(cls: type) -> dict[str, Any]:
    """Public methods and their parameters (return types differ by design:
    ``lease`` is a context manager in one, an async one in the other)."""
    return {
        name: list(inspect.signature(member).parameters.values())
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_sync_and_async_allocators_have_the_same_surface() -> None:
    sync, aio = public(FairAllocator), public(AsyncFairAllocator)
    assert sync.keys() == aio.keys()
    for name, signature in sync.items():
        assert signature == aio[name], name
        assert inspect.iscoroutinefunction(getattr(AsyncFairAllocator, name)) or name in (
            "lease",
            "lease_many",
            "lost",  # no I/O
        )
    assert {
        "acquire",
        "acquire_many",
        "lease_many",
        "release",
        "renew",
        "lease",
        "extend",
        "remove",
        "gc",
        "bind",
        "unbind",
        "status",
        "unquarantine",
        "close",
    } <= set(sync)


# -- packaging ---------------------------------------------------------------------


def test_every_operation_has_a_script_with_its_contract() -> None:
    texts = load_scripts()
    assert set(texts) == set(OPERATIONS)
    for op in OPERATIONS:
        own = (ROOT / "lua" / f"{op}.lua").read_text(encoding="utf-8")
        assert own.startswith(f"-- {op}:"), op
        assert "Reply:" in own, op
        # Never the keyspace: KEYS or SCAN reach keys the script did not
        # declare (and other slots). Paging through a declared hash (HSCAN,
        # gc's repair walk) is bounded and stays in the pool's slot.
        assert "redis.call('KEYS'" not in own and "redis.call('SCAN'" not in own


def test_the_wheel_ships_the_scripts_and_works_from_them(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = out.glob("redis_fair_allocator-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "allocator/py.typed" in names
        for op in (*OPERATIONS, *PRELUDE):
            assert f"allocator/lua/{op}.lua" in names
        zf.extractall(tmp_path / "site")
    # Imported from the unpacked wheel, the scripts are found inside the package.
    probe = (
        "import allocator, allocator._scripts as s; "
        "print(allocator.__file__); print(s.lua_dir()); print(len(s.load_scripts()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": ""},
    )  # fmt: skip
    package, scripts, count = result.stdout.split("\n")[:3]
    assert package.startswith(str(tmp_path / "site"))
    assert scripts == str(tmp_path / "site" / "allocator" / "lua")
    assert int(count) == len(OPERATIONS)


def test_a_reader_left_with_acknowledgements_on_a_gone_server_ends(monkeypatch: Any) -> None:
    """A reader whose last waiter has left but whose acknowledgements could
    not be sent retries while they can matter (the liveness window and one
    pick-up check), then gives them up and stops, instead of retrying a gone
    server for ever (it logged into later tests). While anyone waits, it
    keeps them."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from allocator._core import reader as reader_module
    from allocator._core.liveness import ACK_GIVE_UP, HEARTBEAT

    clock = [1000.0]
    monkeypatch.setattr(reader_module.time, "monotonic", lambda: clock[0])
    pool = Pool.create("p", lease_ttl=60, bind_ttl=60, prefix="alloc")
    down = RedisConnectionError("Connection refused")

    def hub_with_a_pending_ack() -> Any:
        hub = reader_module.Reader(HEARTBEAT)
        hub.register(pool, "lid-1", object())
        grant = "g|lid-1|1-0|7|1|60000|r"
        _inbox, item, _ = hub.route(pool.signal_key(hub.cid), grant, clock[0])
        assert item == grant
        hub.unregister("lid-1")
        assert not hub.idle  # the acknowledgement is still to send
        return hub

    hub = hub_with_a_pending_ack()
    hub.register(pool, "lid-2", object())
    for _ in range(3):
        hub.failed(down)
        clock[0] += ACK_GIVE_UP
        assert not hub.idle  # lid-2 waits: keep everything
    hub.unregister("lid-2")
    hub.failed(down)
    assert hub.idle

    hub = hub_with_a_pending_ack()
    hub.failed(down)
    clock[0] += ACK_GIVE_UP / 2
    hub.failed(down)
    assert not hub.idle  # may still save the holder's lease
    clock[0] += ACK_GIVE_UP / 2 + 0.1
    hub.failed(down)
    assert hub.idle


@pytest.mark.parametrize(
    ("clock", "token"),
    [(1795765274.000042, 1795765274000042), (1795765274.123456, 1795765274123456)],
)
def test_a_first_token_is_the_server_clock_in_microseconds(
    monkeypatch: pytest.MonkeyPatch, clock: float, token: int
) -> None:
    """A resource's first token is the server's clock in microseconds
    (lua/README.md, "Tokens"), made from the two parts of TIME: the
    microseconds are padded to six digits where they have fewer. The server
    here is fakeredis, whose clock the test sets."""
    monkeypatch.setattr(server_mixin, "time", types.SimpleNamespace(time=lambda: clock))
    pool = FairAllocator(fakeredis.FakeRedis(), "clock")
    pool.extend(["r"])
    lease = pool.acquire(blocking=False)
    assert lease is not None and lease.token == token
