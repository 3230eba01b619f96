"""The library on a real Redis Cluster (docs/operations.md#redis-cluster).

One local cluster of three masters (``tests/_cluster.py``) serves the whole
module. Each scenario runs once per flavour: ``redis.cluster.RedisCluster``
and ``redis.asyncio.cluster.RedisCluster``, RESP2 and RESP3, with
``decode_responses`` on and off. Asyncio allocators are driven through a
small blocking view whose calls run as tasks on an event loop in a helper
thread, so every scenario is written once; a waiter is a thread (sync) or a
task on that loop (asyncio, all waiters of one allocator sharing its
router).

Events are ordered by waiting for observable states (a ticket in the queue,
a client blocked on a node, a counter on a node), never by sleeping.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import _servers
import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from _cluster import LocalCluster, Node
from _workers import Proc, leaser, server_now
from helpers import Background, LoopThread, SyncView, wait_until
from redis.cluster import key_slot

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, Lease, UnknownResource
from allocator._core.pool import Pool
from allocator._core.presence import ALIVE_PRESENT, present
from allocator._core.steps import Call
from allocator._scripts import OPERATIONS

# Under pytest-xdist each worker that runs a test of the module starts its
# cluster of three nodes (a module fixture), and its tests run side by side
# on the workers: with one worker running them all, one after another, the
# default run took 240 s in CI, against 196-206 s spread.
pytestmark = pytest.mark.real_redis

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    missing = [exe for exe in ("redis-server",) if shutil.which(exe) is None]
    if missing:
        message = f"{', '.join(missing)} not on PATH: cannot start a local Redis Cluster"
        if IN_CI:
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    reason = _servers.lacks("cluster-port")
    if reason:
        pytest.skip(reason)
    with LocalCluster(masters=3) as made:
        yield made


# -- flavours ---------------------------------------------------------------

# (flavour, protocol, decode_responses): each client meets both protocols
# and both decode settings.
FLAVOURS = [
    ("sync", 2, False),
    ("sync", 3, True),
    ("async", 3, False),
    ("async", 2, True),
]


class Env:
    """Clients and allocators of one flavour on the cluster; closes them."""

    def __init__(self, cluster: LocalCluster, flavour: str, protocol: int, decode: bool) -> None:
        self.cluster, self.flavour, self.protocol, self.decode = cluster, flavour, protocol, decode
        self.loop: LoopThread | None = LoopThread() if flavour == "async" else None
        self._closers: list[Callable[[], None]] = []
        #: A plain sync cluster client for looking at the pool from outside.
        self.raw = self.sync_client(protocol=2, decode_responses=True)

    def sync_client(self, **options: Any) -> redis.cluster.RedisCluster:
        host, port = self.cluster.startup
        options = {"protocol": self.protocol, "decode_responses": self.decode, **options}
        client = redis.cluster.RedisCluster(host=host, port=port, **options)
        self._closers.append(client.close)
        return client

    def async_client(self) -> redis.asyncio.cluster.RedisCluster:
        assert self.loop is not None
        loop = self.loop
        host, port = self.cluster.startup

        async def make() -> redis.asyncio.cluster.RedisCluster:
            client = redis.asyncio.cluster.RedisCluster(
                host=host, port=port, protocol=self.protocol, decode_responses=self.decode
            )
            await client.initialize()
            return client

        client = loop.run(make())
        self._closers.append(lambda: loop.run(client.aclose()))
        return client  # type: ignore[no-any-return]

    def pool(self, name: str, **kwargs: Any) -> Any:
        """A FairAllocator on its own client, or an AsyncFairAllocator (on its
        own client) behind an SyncView: one per simulated process."""
        if self.loop is None:
            return FairAllocator(self.sync_client(), name, **kwargs)
        return SyncView(AsyncFairAllocator(self.async_client(), name, **kwargs), self.loop)

    def close(self) -> None:
        # Cancel the routers first: an async cluster client closed under a
        # blocking read in flight reopens itself when the read ends.
        if self.loop is not None:
            self.loop.drain()
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                closer()
        if self.loop is not None:
            self.loop.close()
            gc.collect()  # tasks that died unobserved report now
            assert not self.loop.errors, "background tasks failed: " + "; ".join(self.loop.errors)


@pytest.fixture(params=FLAVOURS, ids=lambda f: f"{f[0]}-resp{f[1]}-{'str' if f[2] else 'bytes'}")
def env(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[Env]:
    made = Env(cluster, *request.param)
    yield made
    made.close()


# -- helpers ------------------------------------------------------------------


class Job:
    """A call running in a thread (for the async view: a task on the loop,
    awaited from that thread); keeps its result or exception."""

    def __init__(self, fn: Callable[[], Any], env: Env) -> None:
        self._env = env
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float, what: str = "the call") -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            gc.collect()
            errors = []
            if self._env.loop is not None:  # reported here, not again at teardown
                errors, self._env.loop.errors = self._env.loop.errors, []
            pytest.fail(
                f"{what} did not return within {timeout}s"
                + (f"; background tasks failed: {'; '.join(errors)}" if errors else "")
            )
        if self._error is not None:
            raise self._error
        return self._value


def pool_keys(name: str, prefix: str = "alloc") -> tuple[str, ...]:
    return Pool.create(name, lease_ttl=60, bind_ttl=60, prefix=prefix).keys


def slot_of(name: str) -> int:
    return key_slot(pool_keys(name)[0].encode())


def names_on_every_node(cluster: LocalCluster, tag: str) -> list[tuple[str, Node]]:
    """One fresh pool name per master, each with the master its slot is on."""
    found: dict[int, str] = {}
    base = f"{tag}-{uuid.uuid4().hex[:8]}"
    i = 0
    while len(found) < len(cluster.nodes):
        name = f"{base}-{i}"
        found.setdefault(cluster.owner(slot_of(name)).port, name)
        i += 1
    return [(found[node.port], node) for node in cluster.nodes]


def other_node(cluster: LocalCluster, node: Node) -> Node:
    return next(n for n in cluster.nodes if n is not node)


def waiting(pool: Any) -> int:
    return int(pool.status().waiting)


# ---------------------------------------------------------------------------
# 1. Every key of a pool hashes to one slot, whatever the name contains.
# ---------------------------------------------------------------------------

NASTY_NAMES = [
    "plain",
    "a{b}c",
    "}{",
    "{x}",
    "{}",
    "{",
    "}",
    "{{x}}",
    "x}y{z",
    "%7Bx%7D",
    "%",
    "%25",
    "a{b}c{d}e",
    "прокси-池-🚀",
    "{ключ}",
    "x" * 200,
    "{" * 200,
    "}" * 100 + "{" * 100,
    "a b.c:d",
]
PREFIXES = ["alloc", "a{b}", "}{", "%7B", "tenant:{7}"]


@pytest.mark.parametrize("name", NASTY_NAMES, ids=range(len(NASTY_NAMES)))
def test_every_key_of_a_pool_is_in_one_slot(name: str) -> None:
    for prefix in PREFIXES:
        keys = pool_keys(name, prefix)
        signal_keys = [keys[-1] + suffix for suffix in ("someid", "x{y}z", "}{", "🚀")]
        slots = {key_slot(key.encode("utf-8")) for key in (*keys, *signal_keys)}
        assert len(slots) == 1, f"{name!r} with prefix {prefix!r} spreads over slots {slots}"
        assert len(set(keys)) == len(keys)


def test_the_server_agrees_on_the_slot(cluster: LocalCluster) -> None:
    for name in NASTY_NAMES:
        keys = pool_keys(name)
        expected = key_slot(keys[0].encode("utf-8"))
        for key in (*keys, keys[-1] + "someid"):
            assert cluster.keyslot(key.encode("utf-8")) == expected, (name, key)


LOOKALIKES = [
    ("a{b}c", "a%7Bb%7Dc"),
    ("a{b}c", "abc"),
    ("a{b}c", "a{b}c "),
    ("{x}", "x"),
    ("{x}", "%7Bx%7D"),
    ("}{", "{}"),
    ("%7B", "{"),
    ("%", "%25"),
    ("%257B", "%7B"),
]


@pytest.mark.parametrize(("one", "two"), LOOKALIKES)
def test_names_differing_by_braces_or_escapes_have_distinct_keys(one: str, two: str) -> None:
    keys_one, keys_two = pool_keys(one), pool_keys(two)
    assert not set(keys_one) & set(keys_two)
    # Nor can a signal key of one pool be a key of the other.
    assert not any(k.startswith(keys_one[-1]) for k in keys_two)
    assert not any(k.startswith(keys_two[-1]) for k in keys_one)
    # Prefix and name cannot trade characters either.
    assert set(pool_keys(one, prefix="p{")).isdisjoint(pool_keys("{" + one, prefix="p"))


def test_lookalike_pools_never_interact_on_the_cluster(cluster: LocalCluster) -> None:
    host, port = cluster.startup
    client = redis.cluster.RedisCluster(host=host, port=port, protocol=2)
    try:
        for one, two in LOOKALIKES:
            tag = uuid.uuid4().hex[:6]
            first = FairAllocator(client, f"{tag}{one}")
            second = FairAllocator(client, f"{tag}{two}")
            assert first.extend(["only-in-first"]) == 1
            assert second.status().size == 0
            lease = first.acquire(blocking=False)
            assert lease is not None
            assert second.acquire(blocking=False) is None
            assert first.release(lease)
    finally:
        client.close()


# ---------------------------------------------------------------------------
# 2. The basic contract, on pools that live on different masters.
# ---------------------------------------------------------------------------


def test_pools_on_every_master(env: Env) -> None:
    placed = names_on_every_node(env.cluster, "basic")
    assert len({node.port for _, node in placed}) == len(env.cluster.nodes)
    for name, node in placed:
        keys = pool_keys(name)
        # redis-py's routing and the server's slot map agree on the master.
        assert env.raw.get_node_from_key(keys[0]).port == node.port
        assert env.cluster.keyslot(keys[0].encode()) == slot_of(name)
        pool = env.pool(name, lease_ttl=30)
        basic_contract(pool, env.pool(name, lease_ttl=30))
        # The pool's state is on that master.
        assert pool.extend(["left"]) == 1
        assert node.client.hexists(keys[1], "left")
        assert pool.remove(["left"]) == 1


def basic_contract(pool: Any, other: Any) -> None:
    assert pool.extend(["r1", "r2"]) == 2
    assert pool.extend(["r3"], priority=5) == 1
    assert other.extend(["r1", "r2"]) == 0  # idempotent
    status = pool.status()
    assert (status.size, status.free, status.leased, status.waiting) == (3, 3, 0, 0)

    first = pool.acquire(blocking=False)
    assert isinstance(first, Lease) and first.resource == "r3"  # highest priority
    renewed = pool.renew(first, ttl=50)
    assert renewed.expires_at > first.expires_at and renewed.ttl == 50

    other.bind("worker", "r1")
    bound = other.acquire(timeout=5, bind="worker")
    assert bound.resource == "r1"
    with pytest.raises(UnknownResource):
        other.bind("worker", "no-such-resource")

    third = other.acquire(timeout=5)
    assert third.resource == "r2"
    assert pool.acquire(blocking=False) is None  # everything is leased
    status = other.status()
    assert (status.size, status.free, status.leased, status.waiting) == (3, 0, 3, 0)

    assert pool.release(renewed) is True
    assert pool.release(renewed) is False
    assert other.release(bound, quarantine=30) is True
    report = pool.gc()
    assert (report.reclaimed, report.dropped_waiters, report.expired_bindings) == (0, 0, 0)
    states = {r.name: r.state for r in pool.status().resources}
    assert states == {"r1": "quarantined", "r2": "leased", "r3": "free"}

    assert pool.remove(["r2", "unknown"]) == 1  # leased: draining
    assert {r.name: r.state for r in pool.status().resources}["r2"] == "draining"
    assert other.release(third) is True
    assert pool.status().size == 2
    assert pool.remove(["r1", "r3"]) == 2
    assert other.unbind("worker") is True
    assert other.unbind("worker") is False
    assert pool.status().size == 0


# ---------------------------------------------------------------------------
# 3. The blocking path: a grant pushed to a signal key built in the script.
# ---------------------------------------------------------------------------


def test_blocked_waiter_is_granted_on_every_master(env: Env) -> None:
    for name, node in names_on_every_node(env.cluster, "block"):
        holder, waiter = env.pool(name), env.pool(name)
        holder.extend(["r"])
        held = holder.acquire(blocking=False)
        assert held is not None
        job = Job(lambda waiter=waiter: waiter.acquire(timeout=30), env)
        wait_until(lambda holder=holder: waiting(holder) == 1, what="the waiter queued")
        wait_until(lambda node=node: node.blocked_on() >= 1, what="the waiter blocked")
        assert holder.release(held) is True
        got = job.result(10, "the waiter's acquire")
        assert got.resource == "r" and got.token > held.token
        assert waiter.release(got) is True
        assert holder.status().waiting == 0


def test_fifo_with_several_waiters(env: Env) -> None:
    name, _ = names_on_every_node(env.cluster, "fifo")[1]
    holder = env.pool(name)
    holder.extend(["r"])
    held = holder.acquire(blocking=False)
    assert held is not None
    order: list[int] = []
    lock = threading.Lock()

    def waiter(i: int, pool: Any) -> Lease:
        got = pool.acquire(timeout=30)
        with lock:
            order.append(i)
        pool.release(got)
        return got  # type: ignore[no-any-return]

    # The waiters alternate between two allocators, each on its own client
    # (asyncio: two waiters share each allocator's router).
    shared, alone = env.pool(name), env.pool(name)
    jobs = []
    for i, pool in enumerate([shared, alone, shared, alone]):
        jobs.append(Job(lambda i=i, pool=pool: waiter(i, pool), env))
        wait_until(lambda i=i: waiting(holder) == i + 1, what=f"waiter {i} queued")
    assert holder.release(held) is True
    leases = [job.result(10, f"waiter {i}") for i, job in enumerate(jobs)]
    assert order == [0, 1, 2, 3]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(tokens) and tokens[0] > held.token


# ---------------------------------------------------------------------------
# Presence on a cluster (docs/concepts.md#presence-as-a-session): a connection
# per client and slot, to the slot's master, subscribed to a sharded channel there.
# ---------------------------------------------------------------------------


def presence_channels(node: Node, name: str) -> list[bytes]:
    """The presence channels of pool ``name`` with a subscriber on ``node``."""
    found = node.client.execute_command("PUBSUB", "SHARDCHANNELS", f"alloc:{{{name}}}:p:*")
    return list(found)


def test_a_cluster_client_keeps_its_presence_on_the_slots_master(env: Env) -> None:
    """Sync and asyncio clients keep a presence on the master of the
    pool's slot (before, the asyncio cluster client kept none: the liveness
    mark alone judged it)."""
    name, node = names_on_every_node(env.cluster, "presence")[2]
    holder, waiter = env.pool(name), env.pool(name)
    holder.extend(["r"])
    held = holder.acquire(timeout=5)
    job = Job(lambda: waiter.acquire(timeout=30, tenant="w"), env)
    wait_until(lambda: waiting(holder) == 1, what="the waiter queued")
    wait_until(lambda: len(presence_channels(node, name)) == 2, what="both present there")
    assert all(presence_channels(n, name) == [] for n in env.cluster.nodes if n != node)
    assert [info.holder_present for info in holder.leases()] == [True]
    assert holder.status().absent_holders == 0
    assert holder.release(held) is True
    got = job.result(10, "the waiter's acquire")
    assert waiter.release(got) is True


#: As in test_presence: what the clock bound allows beyond the 2 s in which
#: those behind a dead waiter are served (docs/concepts.md#4-liveness) on a
#: loaded 2-core machine. The mark alone would take 12 s.
SLACK = 1.0


def test_a_cluster_waiter_killed_at_the_head_holds_nobody_up(
    cluster: LocalCluster, procs: Callable[..., Proc]
) -> None:
    name, node = names_on_every_node(cluster, "dead")[0]
    host, port = cluster.startup
    client = redis.cluster.RedisCluster(host=host, port=port, decode_responses=True)
    try:
        pool = FairAllocator(client, name)
        pool.extend(["r"])
        held = pool.acquire(timeout=5)
        url = f"cluster://{host}:{port}"
        queued = []
        for i in (1, 2):
            worker = procs(leaser, url, name, wait_go=True)
            worker.expect("ready")
            worker.send("go")
            wait_until(lambda i=i: waiting(pool) == i, what=f"{i} waiting")
            wait_until(lambda i=i: len(presence_channels(node, name)) == 1 + i, what="present")
            queued.append(worker)
        dead, after = queued
        dead.kill()
        wait_until(lambda: len(presence_channels(node, name)) == 2, what="the master saw it die")
        killed = server_now(node.client)
        assert pool.release(held)
        released = server_now(node.client)
        lease: Lease = after.expect("granted", timeout=ALIVE_PRESENT)
        assert lease.granted_at - max(killed, released) < 2.0 + SLACK
        after.send("release")
        assert after.expect("released") is True
    finally:
        client.close()


def test_a_cluster_holder_killed_is_reclaimed_at_once_with_reclaim_on_disconnect(
    cluster: LocalCluster, procs: Callable[..., Proc]
) -> None:
    """The holder's presence is counted on its slot's master, where the
    scripts run: with the option on, its lease ends within 2 s of its death."""
    name, node = names_on_every_node(cluster, "reclaim")[1]
    host, port = cluster.startup
    client = redis.cluster.RedisCluster(host=host, port=port, decode_responses=True)
    try:
        pool = FairAllocator(client, name)
        pool.extend(["r"])
        holder = procs(leaser, f"cluster://{host}:{port}", name, reclaim=True)
        holder.expect("ready")
        held: Lease = holder.expect("granted")
        wait_until(lambda: len(presence_channels(node, name)) == 1, what="present")
        job = Background(lambda: pool.acquire(timeout=30))
        wait_until(lambda: waiting(pool) == 1, what="the waiter queued")
        holder.kill()
        killed = server_now(node.client)
        lease = job.join()
        assert lease.granted_at - killed < 2.0 + SLACK
        assert lease.token > held.token
        assert pool.release(lease)
    finally:
        client.close()


# ---------------------------------------------------------------------------
# 4. A slot that moves while a waiter blocks on it: the server ends the read
#    with MOVED, and the waiter blocks again on the new owner.
# ---------------------------------------------------------------------------


def test_slot_moves_while_a_waiter_blocks(env: Env) -> None:
    name, source = names_on_every_node(env.cluster, "moved")[0]
    target = other_node(env.cluster, source)
    slot = slot_of(name)
    holder, waiter = env.pool(name), env.pool(name)
    holder.extend(["r", "spare"])
    held = holder.acquire(blocking=False)
    spare = holder.acquire(blocking=False)
    assert held is not None and spare is not None
    job = Job(lambda: waiter.acquire(timeout=30, tenant="w"), env)
    wait_until(lambda: waiting(holder) == 1, what="the waiter queued")
    wait_until(lambda: source.blocked_on() >= 1, what="the waiter blocked on the source")
    source.client.config_resetstat()

    env.cluster.migrate_slot(slot, target)
    assert env.cluster.owner(slot) is target
    # The server ends the blocked read with -MOVED; redis-py follows it to
    # the target, where the waiter blocks again.
    wait_until(
        lambda: target.blocked_on() >= 1 and source.blocked_on() == 0,
        what="the waiter blocked on the target",
    )
    # MOVED replies the source gave to blocked clients (those it gave to
    # commands are counted as rejected calls): the blocking read itself was
    # redirected, not only a heartbeat that happened to fall in between.
    # (Valkey counts those replies as rejected calls too, and Redis 6.2 has
    # no errorstats: there the unblocking is shown by the waiter blocking
    # on the target, above.)
    if _servers.lacks("redis7-stats") is None:
        assert source.errorstats().get("MOVED", 0) - source.rejected_calls() >= 1
    assert not job.done

    # The holder's client still maps the slot to the source: its release
    # meets MOVED too, and the grant is pushed on the target.
    assert holder.release(held) is True
    got = job.result(10, "the waiter's acquire, after the slot moved")
    assert got.resource == "r" and got.token > held.token
    # Everything works on the new master afterwards.
    assert waiter.renew(got).resource == "r"
    assert waiter.release(got) is True
    assert holder.release(spare) is True
    status = holder.status()
    assert (status.size, status.leased, status.waiting) == (2, 0, 0)
    assert target.client.exists(pool_keys(name)[1]) == 1
    holder.gc()


def test_waiter_survives_a_slot_in_migration_longer_than_redis_py_retries(env: Env) -> None:
    """Resharding with the pool's slot open (MIGRATING/IMPORTING) while its
    keys are not all on one side: every script run on the pool meets
    TRYAGAIN, which redis-py retries only RedisClusterRequestTTL times
    (about 0.4 s) before raising ClusterError. A waiter's heartbeat that
    falls in such a window must not cost it its place nor kill it."""
    name, source = names_on_every_node(env.cluster, "window")[0]
    target = other_node(env.cluster, source)
    slot = slot_of(name)
    holder, waiter = env.pool(name), env.pool(name)
    holder.extend(["r"])
    held = holder.acquire(blocking=False)
    assert held is not None
    job = Job(lambda: waiter.acquire(timeout=20), env)
    wait_until(lambda: waiting(holder) == 1, what="the waiter queued")
    wait_until(lambda: source.blocked_on() >= 1, what="the waiter blocked on the source")

    def tryagain() -> int:
        return source.errorstats().get("TRYAGAIN", 0)

    before = tryagain()
    budget = redis.cluster.RedisCluster.RedisClusterRequestTTL
    with env.cluster.migrating(slot, target):
        # The waiter's next heartbeat runs into the open slot; wait until
        # redis-py has spent a whole retry budget on it.
        wait_until(
            lambda: tryagain() - before >= budget,
            timeout=10,
            what="a heartbeat of the waiter exhausting redis-py's TRYAGAIN retries",
        )
    assert env.cluster.owner(slot) is target
    assert holder.release(held) is True
    # The grant is pushed at once; a waiter whose retries back off may take
    # a couple of seconds to look again.
    got = job.result(5, "the waiter's acquire, after the migration window")
    assert got.resource == "r" and got.token > held.token
    assert waiter.release(got) is True


# ---------------------------------------------------------------------------
# 5. The scripts declare their keys; all of them run without slot errors.
# ---------------------------------------------------------------------------


def test_server_rejects_a_script_touching_another_masters_key(cluster: LocalCluster) -> None:
    """Sanity: the cluster does check what a script touches. (Redis 7.0 lets
    a script touch an undeclared key of another slot on the same master, so
    the test below also watches which keys the scripts write.)"""
    name, node = names_on_every_node(cluster, "sanity")[0]
    keys = pool_keys(name)
    far = next(
        f"far-{i}"
        for i in range(10_000)
        if cluster.owner(key_slot(f"far-{i}".encode())) is not node
    )
    host, port = cluster.startup
    client = redis.cluster.RedisCluster(host=host, port=port, protocol=2, decode_responses=True)
    try:
        with pytest.raises(redis.ResponseError, match="non local key"):
            client.eval("return redis.call('SET', ARGV[1], 'x')", len(keys), *keys, far)
        with pytest.raises(redis.RedisClusterException, match="same key slot"):
            client.eval("return 1", 2, keys[0], far)
        # Declared keys of two slots on one master: the server refuses them.
        near = next(
            f"near-{i}"
            for i in range(10_000)
            if key_slot(f"near-{i}".encode()) != slot_of(name)
            and cluster.owner(key_slot(f"near-{i}".encode())) is node
        )
        with pytest.raises(redis.ResponseError, match="same slot"):
            node.client.eval("return 1", 2, keys[0], near)
        # The documented exception: a signal key built in the script from
        # KEYS[13] lives in the pool's slot and is accepted.
        script = (
            "redis.call('RPUSH', KEYS[13] .. ARGV[1], 'x');"
            " return redis.call('LPOP', KEYS[13] .. ARGV[1])"
        )
        assert client.eval(script, len(keys), *keys, "someid") == "x"
    finally:
        client.close()


def record_scripts(pool: Any) -> set[str]:
    """Watch the script calls the allocator's shell carries out; returns the
    set of the operations that ran (filled as they run)."""
    inner = getattr(pool, "inner", pool)
    used: set[str] = set()
    original = inner._step

    def step(each: Any) -> Any:
        if isinstance(each, Call):
            used.add(each.script)
        return original(each)  # for the asyncio shell: the coroutine

    inner._step = step
    return used


@contextlib.contextmanager
def keyspace_audit(node: Node, tag_key: str) -> Iterator[list[bytes]]:
    """Collect every key written on ``node`` while the body runs (keyspace
    notifications); ``tag_key`` must hash to a slot of ``node``."""
    node.client.config_set("notify-keyspace-events", "EA")
    pubsub = node.client.pubsub()
    written: list[bytes] = []
    try:
        pubsub.psubscribe("__keyevent@0__:*")
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"  # type: ignore[index]
        yield written
        sentinel = (tag_key + ":audit-sentinel").encode()
        node.client.set(sentinel, "1")
        node.client.delete(sentinel)
        seen_sentinel = 0
        while seen_sentinel < 2:
            message = pubsub.get_message(timeout=5)
            assert message is not None, "keyspace notifications stopped"
            if message["type"] != "pmessage":
                continue
            if message["data"] == sentinel:
                seen_sentinel += 1
            else:
                written.append(message["data"])
    finally:
        pubsub.close()
        node.client.config_set("notify-keyspace-events", "")


def test_every_script_runs_clean_and_writes_only_declared_keys(env: Env) -> None:
    name, node = names_on_every_node(env.cluster, "audit")[2]
    keys = pool_keys(name)
    admin, waiter = env.pool(name, lease_ttl=30), env.pool(name, lease_ttl=30)
    used = record_scripts(admin)
    used_by_waiter = record_scripts(waiter)
    for each in env.cluster.nodes:
        each.client.config_resetstat()

    with keyspace_audit(node, keys[0]) as written:
        exercise_every_script(env, admin, waiter, node)

    used |= used_by_waiter
    assert used == set(OPERATIONS), f"the scenario left out {set(OPERATIONS) - used}"
    for each in env.cluster.nodes:
        stats, errors = each.info("commandstats"), each.errorstats()
        # The first run of a script on the cluster meets NOSCRIPT (a failed
        # call) and loads it; nothing else may fail or be refused.
        failed = {
            command: (row.get("failed_calls", 0), row.get("rejected_calls", 0))
            for command, row in stats.items()
            if command in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_blpop", "cmdstat_blmpop")
        }
        assert sum(f for f, _ in failed.values()) == errors.get("NOSCRIPT", 0), (each, failed)
        assert sum(r for _, r in failed.values()) == 0, (each, failed, errors)
        assert "CROSSSLOT" not in errors
    declared = {k.encode() for k in keys}
    signal = keys[-1].encode()
    undeclared = {k for k in written if k not in declared and not k.startswith(signal)}
    assert not undeclared, f"scripts wrote keys they did not declare: {undeclared}"
    assert any(k.startswith(signal) for k in written), "no grant was pushed to a signal key"
    assert written, "no writes seen"


def admin_pool(pool: Any) -> Any:
    """The core Pool behind a FairAllocator or a SyncView of an async one."""
    return getattr(pool, "inner", pool)._pool


def run_step(env: Env, pool: Any, step: Any) -> Any:
    """Carry out one step through the allocator's own shell."""
    out = getattr(pool, "inner", pool)._step(step)
    if inspect.iscoroutine(out):
        assert env.loop is not None
        return env.loop.run(out)
    return out


def exercise_every_script(env: Env, admin: Any, waiter: Any, node: Node) -> None:
    assert admin.extend(["r"]) == 1  # extend
    # set_order, set_weight: the rest runs under the order "tenant", so that
    # the tenant index (keys 17 to 19) is written too.
    admin.set_order("tenant")
    admin.set_tenant_weight("w", 2)
    admin.bind("w", "r")  # bind
    assert admin.unbind("w") is True  # unbind
    (one,) = admin.acquire_many(1, timeout=5)  # acquire_many
    assert admin.release(one) is True
    held = admin.acquire(blocking=False, bind="w")  # acquire
    assert held is not None
    held = admin.renew(held)  # renew
    job = Job(lambda: waiter.acquire(timeout=30, tenant="w"), env)
    wait_until(lambda: waiting(admin) == 1, what="the waiter queued")
    wait_until(lambda: node.blocked_on() >= 1, what="the waiter blocked")
    # Released into a short quarantine: the head of the queue gets a hint
    # (a push to its signal key), looks again when it ends (poll), and is
    # granted.
    assert admin.release(held, quarantine=0.05) is True  # release
    got = job.result(10, "the waiter's acquire")
    with pytest.raises(AcquireTimeout):
        admin.acquire(timeout=0.05)  # cancel, on the way out
    assert admin.status().leased == 1  # status (and tenants)
    admin.gc()  # gc
    assert [info.resource for info in admin.leases()] == ["r"]  # leases
    assert sum(c.leases for c in admin.clients()) == 1  # clients
    assert admin.stats().grants == 3  # stats: acquire_many, acquire, the waiter
    admin.set_events(100)  # set_events (the log on, then off again)
    admin.set_events(None)
    admin.quarantine("r", 60)  # quarantine
    assert admin.unquarantine("r") is True  # unquarantine
    assert admin.revoke(lease_id=got.id) is True  # revoke
    # present: sent by a client's presence watch after each new subscription;
    # a client with no subscriber is told so, and nothing is written.
    call = present(admin_pool(admin), "p.nobody")
    assert call.parse(run_step(env, admin, call)) == 0
    got = admin.acquire(timeout=5)
    assert admin.remove(["r"]) == 1  # remove (draining)
    assert admin.release(got) is True
    assert admin.status().size == 0
    assert admin.delete() is True  # delete
