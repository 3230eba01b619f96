"""Replicas and Sentinel (docs/operations.md#replicas-min_replicas,
docs/operations.md#sentinel): ``min_replicas``,
``replica_timeout``, ``NotReplicated``, and Sentinel-managed clients through
a failover.

Real processes: a primary with replicas (``--replicaof``) and three
Sentinels (tests/_replication.py), of the matrix's server binary.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from _replication import MASTER, Replicated, Sentinels, sentinel_worker, wait_for
from _workers import CTX
from helpers import LoopThread, readers_quiet

from allocator import AsyncFairAllocator, FairAllocator, LeaseLost, NotReplicated
from allocator._core.keys import KEY_SUFFIXES
from allocator._core.pool import Pool
from allocator._core.replicas import Confirmed, confirm_commands, confirming

pytestmark = [pytest.mark.real_redis, pytest.mark.replicas]


# -- the core, without I/O -------------------------------------------------------


@pytest.mark.parametrize("cls", [FairAllocator, AsyncFairAllocator])
@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"min_replicas": -1}, ValueError, "min_replicas"),
        ({"min_replicas": 1.0}, TypeError, "min_replicas"),
        ({"min_replicas": True}, TypeError, "min_replicas"),
        ({"min_replicas": 10**6}, ValueError, "min_replicas"),
        ({"replica_timeout": 0}, ValueError, "replica_timeout"),
        ({"replica_timeout": -1.0}, ValueError, "replica_timeout"),
        ({"replica_timeout": float("nan")}, ValueError, "replica_timeout"),
        ({"replica_timeout": "1"}, TypeError, "replica_timeout"),
    ],
)
def test_bad_replica_settings_fail_before_io(
    cls: Any, kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    client: Any = object.__new__(redis.Redis if cls is FairAllocator else redis.asyncio.Redis)
    with pytest.raises(error, match=text):
        cls(client, "p", **kwargs)


def test_confirm_commands_put_a_write_between_the_script_and_wait() -> None:
    pool = Pool.create(
        "p", lease_ttl=5, bind_ttl=5, prefix="alloc", min_replicas=2, replica_timeout=0.25
    )
    call = pool._confirmed(pool._renew_call(_lease(), 1000))
    script = ("EVALSHA", "abc", len(pool.keys), *pool.keys)
    commands = confirm_commands(call, script)
    assert commands[0] == script
    assert commands[1] == ("HINCRBY", pool.keys[0], "wseq", 1)
    assert commands[2] == ("WAIT", 2, 250)

    def invoke() -> Any:  # as Scripts.invoke: FCALL, the library missing, load, again
        try:
            yield ("FCALL", "renew_x", 0)
        except redis.ResponseError:
            yield ("FUNCTION", "LOAD", "REPLACE", "...")
        return (yield ("FCALL", "renew_x", 0))

    flow = confirming(call, invoke())
    first = next(flow)
    assert isinstance(first, list) and first[0][0] == "FCALL" and first[2][0] == "WAIT"
    load = flow.send([redis.ResponseError("Function not found"), 1, 2])
    assert load == ("FUNCTION", "LOAD", "REPLACE", "...")  # not confirmed: no write of its own
    again = flow.send("OK")
    assert isinstance(again, list)
    with pytest.raises(StopIteration) as done:
        flow.send([["renewed", 5], 2, 1])
    assert done.value.value == Confirmed(["renewed", 5], 1)
    # An error of the marker or of WAIT itself is raised.
    flow = confirming(call, invoke())
    next(flow)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        flow.send([["renewed", 5], 1, redis.ResponseError("unknown command 'wait'")])


def _lease() -> Any:
    from allocator import Lease

    return Lease(
        resource="r", token=1, id="x", ticket="1-0", expires_at=0.0, ttl=1.0, granted_at=0.0,
        pool="p",
    )  # fmt: skip


# -- a primary and one replica ---------------------------------------------------------


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    with Replicated(replicas=1) as made:
        yield made


def _recs(pool: Any) -> str:
    return str(pool._pool.keys[KEY_SUFFIXES.index("recs")])


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_confirmed_grant_and_renewal_are_on_the_replica(
    replicated: Replicated, pool_name: str, flavour: str
) -> None:
    replica = replicated.client(replicated.replicas[0], decode_responses=True)
    if flavour == "sync":
        client = replicated.client()
        pool = FairAllocator(client, pool_name, min_replicas=1, replica_timeout=5.0)
        pool.extend(["a"])
        lease = pool.acquire(timeout=5)
        # WAIT said one replica has everything up to the grant: it is there.
        assert replica.hexists(_recs(pool), lease.id)
        renewed = pool.renew(lease, ttl=120)
        assert renewed.expires_at > lease.expires_at
        assert pool.release(renewed)
        client.close()
    else:

        async def run() -> None:
            client = redis.asyncio.Redis(host="127.0.0.1", port=replicated.primary.port)
            pool = AsyncFairAllocator(client, pool_name, min_replicas=1, replica_timeout=5.0)
            await pool.extend(["a"])
            lease = await pool.acquire(timeout=5)
            assert replica.hexists(_recs(pool), lease.id)
            renewed = await pool.renew(lease, ttl=120)
            assert renewed.expires_at > lease.expires_at
            assert await pool.release(renewed)
            await client.aclose()

        asyncio.run(run())
    replica.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_stopped_replica_makes_acquire_raise_and_leaves_the_pool_whole(
    replicated: Replicated, pool_name: str, flavour: str
) -> None:
    client = replicated.client()
    admin = FairAllocator(client, pool_name)
    admin.extend(["a", "b"])
    replicated.stop_replica()
    timeout = 0.3
    if flavour == "sync":
        pool = FairAllocator(client, pool_name, min_replicas=1, replica_timeout=timeout)
        for _ in range(3):
            with pytest.raises(NotReplicated) as caught:
                pool.acquire(timeout=5)
            assert caught.value.replicas == 0 and caught.value.wanted == 1
            assert caught.value.operation == "acquire"
    else:

        async def run() -> None:
            aclient = redis.asyncio.Redis(host="127.0.0.1", port=replicated.primary.port)
            pool = AsyncFairAllocator(aclient, pool_name, min_replicas=1, replica_timeout=timeout)
            for _ in range(3):
                with pytest.raises(NotReplicated):
                    await pool.acquire(timeout=5)
            await aclient.aclose()

        asyncio.run(run())
    status = admin.status()
    assert status.free == status.size == 2 and status.leased == 0 and status.waiting == 0
    # Without a confirmation asked for, the same pool works as before.
    lease = admin.acquire(timeout=5)
    assert admin.release(lease)
    client.close()


def test_renew_not_replicated_keeps_the_lease(replicated: Replicated, pool_name: str) -> None:
    client = replicated.client()
    # The acquire waits as long as a loaded machine needs (a replica slower
    # than 0.3 s made it flaky); the renew, with the replica gone, need not.
    patient = FairAllocator(client, pool_name, min_replicas=1, replica_timeout=20)
    pool = FairAllocator(client, pool_name, min_replicas=1, replica_timeout=0.3)
    patient.extend(["a"])
    lease = patient.acquire(timeout=30)
    replicated.stop_replica()
    with pytest.raises(NotReplicated) as caught:
        pool.renew(lease, ttl=30)
    assert caught.value.operation == "renew" and caught.value.token == lease.token
    # The lease stays as the primary has it: held, and renewed there.
    status = FairAllocator(client, pool_name).status()
    assert status.leased == 1
    plain = FairAllocator(client, pool_name)
    assert plain.renew(lease, ttl=30).resource == "a"
    assert plain.release(lease)
    client.close()


def test_pushed_grant_is_confirmed_before_acquire_returns(
    replicated: Replicated, pool_name: str
) -> None:
    """A grant another client's release pushes to a waiter: with the
    replica up the waiter gets it; with the replica down it raises
    NotReplicated and the resource goes back to the pool."""
    client = replicated.client()
    plain = FairAllocator(client, pool_name)
    plain.extend(["a"])
    for replica_up in (True, False):
        # With the replica up, as long as a loaded machine needs; down, short.
        confirming = FairAllocator(
            replicated.client(),
            pool_name,
            min_replicas=1,
            replica_timeout=20 if replica_up else 0.3,
        )
        held = plain.acquire(timeout=5)
        outcome: list[Any] = []
        waiter = threading.Thread(target=_attempt, args=(confirming, 30, outcome), daemon=True)
        waiter.start()
        wait_for("the waiter to queue", lambda: plain.status().waiting == 1)
        if not replica_up:
            replicated.stop_replica()
        assert plain.release(held)
        waiter.join(30)
        assert not waiter.is_alive()
        if replica_up:
            assert outcome and not isinstance(outcome[0], Exception), outcome
            assert confirming.release(outcome[0])
        else:
            assert outcome and isinstance(outcome[0], NotReplicated), outcome
    status = plain.status()
    assert status.free == status.size == 1 and status.waiting == 0
    readers_quiet(confirming)
    client.close()


def _attempt(pool: FairAllocator, timeout: float, outcome: list[Any]) -> None:
    try:
        outcome.append(pool.acquire(timeout=timeout))
    except Exception as exc:
        outcome.append(exc)


def test_a_failover_that_lost_a_grant_meets_its_holder_as_lease_lost(
    replicated: Replicated, pool_name: str
) -> None:
    """The replica is promoted (``REPLICAOF NO ONE``) while the old primary
    still takes writes, as in a partition. An unconfirmed grant made on the
    old primary then is unknown to the new one: its holder's renew there
    raises LeaseLost. A confirmed acquire on the old primary at that point
    raises NotReplicated instead of returning a lease the new primary lacks."""
    old = replicated.client()
    new = replicated.client(replicated.replicas[0])
    FairAllocator(old, pool_name).extend(["a", "b"])
    old.execute_command("WAIT", 1, 5000)
    new.execute_command("REPLICAOF", "NO", "ONE")
    wait_for("the old primary to lose its replica", lambda: old.info()["connected_slaves"] == 0)
    unconfirmed = FairAllocator(old, pool_name).acquire(timeout=5)
    with pytest.raises(NotReplicated):
        FairAllocator(old, pool_name, min_replicas=1, replica_timeout=0.2).acquire(timeout=5)
    on_new = FairAllocator(new, pool_name)
    with pytest.raises(LeaseLost):
        on_new.renew(unconfirmed)
    assert on_new.release(unconfirmed) is False
    status = on_new.status()
    assert status.free == status.size == 2  # the new primary never saw the grant
    old.close()
    new.close()


# -- Sentinel ------------------------------------------------------------------------


@pytest.fixture
def sentinel_set() -> Iterator[tuple[Replicated, Sentinels]]:
    with Replicated(replicas=2) as replicated, Sentinels(replicated) as sentinels:
        yield replicated, sentinels


#: A lease's ttl that outlives any failover in these tests.
LONG = 600.0


def test_sentinel_clients_through_a_failover(
    sentinel_set: tuple[Replicated, Sentinels], pool_name: str
) -> None:
    """Sync and asyncio ``master_for`` clients: a lease confirmed before a
    failover is still held after it (renewed through the new master), and
    both go on granting."""
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel
    from redis.sentinel import Sentinel

    replicated, sentinels = sentinel_set
    sync_client = Sentinel(sentinels.addresses, socket_timeout=2.0).master_for(
        MASTER, socket_timeout=5.0
    )
    pool = FairAllocator(sync_client, pool_name, min_replicas=1, replica_timeout=2.0)
    pool.extend(["a", "b", "c"])
    # Leases that outlive the failover (Sentinel's default down-after is
    # 30 s; on a loaded machine the whole run has taken over a minute): one
    # that expired meanwhile would free its resource for the waiter.
    before = pool.acquire(timeout=5, ttl=LONG)

    async def async_part(phase: str, held: Any) -> Any:
        aclient = AsyncSentinel(sentinels.addresses, socket_timeout=2.0).master_for(
            MASTER, socket_timeout=5.0
        )
        apool = AsyncFairAllocator(aclient, pool_name, min_replicas=1, replica_timeout=2.0)
        try:
            if phase == "before":
                return await apool.acquire(timeout=5, ttl=LONG)
            renewed = await _retry_async(lambda: apool.renew(held, ttl=60))
            assert renewed.token == held.token
            again = await _retry_async(lambda: apool.acquire(timeout=5))
            assert await apool.release(again)
            return await apool.release(renewed)
        finally:
            await aclient.aclose()

    held_async = asyncio.run(async_part("before", None))
    last = pool.acquire(timeout=5, ttl=LONG)
    # A waiter blocks (its reader on a connection of the Sentinel pool)
    # through the failover.
    waiter_client = Sentinel(sentinels.addresses, socket_timeout=2.0).master_for(
        MASTER, socket_timeout=5.0
    )
    waiter = FairAllocator(waiter_client, pool_name, min_replicas=1, replica_timeout=2.0)
    outcome: list[Any] = []
    thread = threading.Thread(target=_attempt, args=(waiter, 60, outcome), daemon=True)
    thread.start()
    wait_for("the waiter to queue", lambda: pool.status().waiting == 1)
    # And an asyncio waiter, its reader a task on a Sentinel pool connection.
    loop = LoopThread()
    aclient = loop.run(_async_master(sentinels))
    apool = AsyncFairAllocator(aclient, pool_name, min_replicas=1, replica_timeout=2.0)
    awaited = asyncio.run_coroutine_threadsafe(apool.acquire(timeout=60), loop.loop)
    wait_for("the asyncio waiter to queue", lambda: pool.status().waiting == 2)
    old = sentinels.master_address()
    replicated.primary.stop(kill=True)  # the hard way: no goodbye to the replicas
    new = wait_for(
        "Sentinel to promote a replica",
        lambda: (addr := sentinels.master_address()) != old and addr,
        timeout=60,
    )
    assert new != old
    # The confirmed leases survived on the new master.
    renewed = _retry(lambda: pool.renew(before, ttl=60))
    assert renewed.token == before.token
    # The waiter's reader reconnected to the new master: a release there
    # reaches it, and its grant is confirmed.
    assert _retry(lambda: pool.release(last))
    thread.join(60)
    assert outcome, "the waiter never returned"
    if isinstance(outcome[0], NotReplicated):
        # Its grant came while the new master's replica was still catching
        # up: given back, as min_replicas promises. It asks again.
        outcome[0] = _retry(lambda: waiter.acquire(timeout=5))
    assert not isinstance(outcome[0], Exception), outcome
    assert outcome[0].resource == last.resource and outcome[0].token > last.token
    assert waiter.release(outcome[0])
    readers_quiet(waiter)
    waiter_client.close()
    # The asyncio waiter, next in line, was handed that release's resource.
    try:
        agot = awaited.result(60)
    except NotReplicated:  # as above: given back; it asks again
        agot = loop.run(_retry_async(lambda: apool.acquire(timeout=5)))
    assert agot.resource == last.resource and agot.token > outcome[0].token
    assert loop.run(apool.release(agot))
    loop.run(aclient.aclose())
    loop.close()
    assert asyncio.run(async_part("after", held_async))
    after = _retry(lambda: pool.acquire(timeout=5))
    assert after.resource != before.resource or after.token > before.token
    assert pool.release(after) and pool.release(renewed)
    status = pool.status()
    assert status.free == status.size == 3
    sync_client.close()


async def _async_master(sentinels: Sentinels) -> Any:
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    return AsyncSentinel(sentinels.addresses, socket_timeout=2.0).master_for(
        MASTER, socket_timeout=5.0
    )


def _retry(call: Any, timeout: float = 30.0) -> Any:
    """Call until it stops raising NotReplicated or a transport error (the
    new master's replica is still catching up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except (NotReplicated, redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def _retry_async(call: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except (NotReplicated, redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


WORKERS = 4
RESOURCES = ["a", "b", "c"]
TTL = 2.0
HOLD = 0.05


@pytest.mark.slow
def test_failover_under_load_keeps_confirmed_leases_exclusive(
    sentinel_set: tuple[Replicated, Sentinels], pool_name: str, tmp_path: Path
) -> None:
    """Workers loop on a pool with ``min_replicas=1`` through a Sentinel
    client while the primary is SIGKILLed and Sentinel promotes a replica.

    On the workers' ledgers: no fencing token is handed out twice for a
    resource, and no two leases that ``acquire`` returned (so confirmed)
    overlap on a resource, a lease counting from its start to its end or its
    last confirmed deadline, whichever is first. After the load stops and
    every lease has run out, one gc leaves the pool whole.
    """
    replicated, sentinels = sentinel_set
    admin_client = redis.sentinel.Sentinel(sentinels.addresses).master_for(MASTER)
    admin = FairAllocator(admin_client, pool_name)
    admin.extend(RESOURCES)
    stop = CTX.Value("i", 0, lock=False)
    ledgers = [tmp_path / f"ledger-{i}.jsonl" for i in range(WORKERS)]
    workers = [
        CTX.Process(
            target=sentinel_worker,
            args=(sentinels.addresses, pool_name, str(path), 7 + i, stop, TTL, HOLD, 1),
            daemon=True,
        )
        for i, path in enumerate(ledgers)
    ]
    for worker in workers:
        worker.start()
    try:
        # Load before the failover: some leases confirmed on the old primary.
        wait_for("leases before the failover", lambda: _begins(ledgers) >= 40, timeout=60)
        old = sentinels.master_address()
        replicated.primary.stop(kill=True)
        wait_for(
            "Sentinel to promote a replica",
            lambda: (addr := sentinels.master_address()) != old and addr,
            timeout=60,
        )
        seen = _begins(ledgers)
        # Load after it: the workers went on through the new master.
        wait_for("leases after the failover", lambda: _begins(ledgers) >= seen + 40, timeout=60)
    finally:
        stop.value = 1
        for worker in workers:
            worker.join(30)
    for worker in workers:
        assert worker.exitcode == 0, f"worker {worker.pid} ended with {worker.exitcode}"

    leases, errors = _read(ledgers)
    print(f"failover: {len(leases)} confirmed leases, errors {dict(errors)}")
    by_resource: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for lease in leases:
        by_resource[lease["resource"]].append(lease)
    for resource, rows in by_resource.items():
        tokens = [row["token"] for row in rows]
        assert len(tokens) == len(set(tokens)), f"{resource}: a token was handed out twice"
        # A lease its holder got only after its deadline had passed (the
        # acquire returned late: a worker starved of CPU across the
        # failover) was held at no instant: its interval [start, until] is
        # empty and overlaps nothing. Every other one is checked against
        # the next to start.
        held = sorted(
            (row for row in rows if row["until"] > row["start"]), key=lambda row: row["start"]
        )
        for first, second in itertools.pairwise(held):
            assert first["until"] <= second["start"], (
                f"{resource}: two confirmed holders at once: {first} and {second}"
            )

    def whole() -> bool:
        _retry(admin.gc)
        status = _retry(admin.status)
        return bool(status.free == status.size == len(RESOURCES) and status.waiting == 0)

    wait_for("the pool to be whole after gc", whole, timeout=60, every=0.5)
    admin_client.close()


def _begins(ledgers: list[Path]) -> int:
    total = 0
    for path in ledgers:
        if path.exists():
            total += sum(1 for line in path.read_text().splitlines() if '"begin"' in line)
    return total


def _read(ledgers: list[Path]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each confirmed lease: resource, token, start, and ``until``: its end,
    or its last confirmed deadline if that came first (a holder that lost
    it unknowingly counts until then)."""
    leases: list[dict[str, Any]] = []
    errors: dict[str, int] = defaultdict(int)
    for path in ledgers:
        current: dict[str, Any] | None = None
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            kind = row["kind"]
            if kind == "begin":
                current = {
                    "resource": row["resource"], "token": row["token"], "start": row["start"],
                    "deadline": row["expires_at"], "until": row["expires_at"],
                }  # fmt: skip
                leases.append(current)
            elif kind == "renew" and current is not None:
                current["deadline"] = current["until"] = row["expires_at"]
            elif kind == "end" and current is not None:
                current["until"] = min(row["end"], current["deadline"])
                current = None
            elif kind == "error":
                errors[f"{row['op']}:{row['error']}"] += 1
    return leases, errors


def test_core_confirms_a_pushed_grant_and_gives_back_an_unconfirmed_one() -> None:
    """The decision, without I/O: a grant pushed to a queued waiter is
    confirmed by a confirmed renew; confirmed by too few, it is released
    and NotReplicated raised (the shells only carry the steps out)."""
    from allocator._core.replicas import Confirmed
    from allocator._core.steps import Call, Wait

    pool = Pool.create(
        "p", lease_ttl=5, bind_ttl=5, prefix="alloc", min_replicas=1, replica_timeout=0.1
    )
    for replicas in (1, 0):
        flow = pool.acquire(10, None, None, True, cid="c")
        steps = flow.steps
        step = next(steps)
        assert isinstance(step, Call) and step.script == "acquire" and step.confirm == (1, 100)
        step = steps.send(Confirmed(["queued", "5-0", -1], 1))
        assert isinstance(step, Wait)
        step = steps.send(f"g|{flow.lid}|5-0|42|5000000|5000|r")
        assert isinstance(step, Call) and step.script == "renew" and step.confirm == (1, 100)
        if replicas:
            with pytest.raises(StopIteration) as done:
                steps.send(Confirmed(["renewed", 10_000], 1))
            assert done.value.value.token == 42 and done.value.value.expires_at == 10.0
            continue
        step = steps.send(Confirmed(["renewed", 10_000], 0))
        assert isinstance(step, Call) and step.script == "release" and step.confirm is None
        step = steps.send(["released"])
        assert isinstance(step, Call) and step.script == "cancel"  # leaving: nothing left
        with pytest.raises(NotReplicated) as caught:
            steps.send(["gone"])
        assert caught.value.replicas == 0 and caught.value.token == 42
