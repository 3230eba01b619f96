"""Redis Cluster with a replica per master: ``min_replicas`` on many pools
spread over the slots, through a slot migration while a waiter waits, and
through a master failover (``CLUSTER FAILOVER``).

The confirmation of a grant goes, with the script, to the master of the
pool's slot (WAIT names no key); these tests check that it reached that
master's replica.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import _servers
import pytest
import redis
import redis.asyncio.cluster
from _cluster import LocalCluster, Node
from helpers import readers_quiet, wait_until
from redis.cluster import RedisCluster

from allocator import AsyncFairAllocator, FairAllocator, Lease, NotReplicated
from allocator._core.keys import KEY_SUFFIXES
from allocator._core.pool import Pool

# Under pytest-xdist each worker that runs a test of the module starts its
# cluster of six nodes (a module fixture), as tests/test_cluster.py does.
pytestmark = [pytest.mark.real_redis, pytest.mark.replicas]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    reason = _servers.lacks("cluster-port")
    if reason:
        pytest.skip(reason)
    with LocalCluster(masters=3, replicas=1) as made:
        yield made


def _client(cluster: LocalCluster) -> RedisCluster:
    host, port = cluster.startup
    return RedisCluster(host=host, port=port)


def _recs(name: str) -> str:
    keys = Pool.create(name, lease_ttl=60, bind_ttl=60, prefix="alloc").keys
    return keys[KEY_SUFFIXES.index("recs")]


def _replica_of(cluster: LocalCluster, master: Node) -> Node:
    return next(r for r in cluster.replicas if r.master is master)


def _has(node: Node, name: str, lid: str) -> bool:
    """Whether ``node`` (a replica: READONLY lets it answer for its
    master's slots) has the record of lease ``lid`` of pool ``name``."""
    with redis.Redis(host=node.host, port=node.port, single_connection_client=True) as one:
        one.execute_command("READONLY")
        return bool(one.hexists(_recs(name), lid))


def _master_for(cluster: LocalCluster, name: str) -> Node:
    slot = cluster.keyslot(_recs(name))
    return cluster.owner(slot)


def test_many_pools_over_the_slots_are_confirmed_on_their_masters_replica(
    cluster: LocalCluster,
) -> None:
    client = _client(cluster)
    names = [f"many-{uuid.uuid4().hex[:8]}-{i}" for i in range(24)]
    masters = {_master_for(cluster, name).port for name in names}
    assert len(masters) == len(cluster.nodes), "the pools should cover every master"
    for name in names:
        pool = FairAllocator(client, name, min_replicas=1, replica_timeout=5.0)
        pool.extend(["r"])
        lease = pool.acquire(timeout=5)
        replica = _replica_of(cluster, _master_for(cluster, name))
        assert _has(replica, name, lease.id), name
        lease = pool.renew(lease, ttl=120)
        assert pool.release(lease)

    async def run() -> None:
        host, port = cluster.startup
        aclient = redis.asyncio.cluster.RedisCluster(host=host, port=port)
        for name in names[:6]:
            apool = AsyncFairAllocator(aclient, name, min_replicas=1, replica_timeout=5.0)
            lease = await apool.acquire(timeout=5)
            replica = _replica_of(cluster, _master_for(cluster, name))
            assert _has(replica, name, lease.id), name
            assert await apool.release(await apool.renew(lease, ttl=120))
        await aclient.aclose()

    asyncio.run(run())
    # More replicas than there are: NotReplicated, and the pool stays whole.
    greedy = FairAllocator(client, names[0], min_replicas=2, replica_timeout=0.2)
    with pytest.raises(NotReplicated):
        greedy.acquire(timeout=5)
    status = greedy.status()
    assert status.free == status.size == 1
    client.close()


def _wait_in_thread(pool: FairAllocator, outcome: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            outcome.append(pool.acquire(timeout=60))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_slot_migration_while_a_confirmed_waiter_waits(cluster: LocalCluster) -> None:
    client = _client(cluster)
    name = f"migrate-{uuid.uuid4().hex[:8]}"
    holder = FairAllocator(client, name)
    holder.extend(["r"])
    held = holder.acquire(timeout=5)
    waiter = FairAllocator(_client(cluster), name, min_replicas=1, replica_timeout=5.0)
    outcome: list[Any] = []
    thread = _wait_in_thread(waiter, outcome)
    wait_until(lambda: holder.status().waiting == 1, what="the waiter queued")
    source = _master_for(cluster, name)
    target = next(n for n in cluster.nodes if n is not source)
    cluster.migrate_slot(cluster.keyslot(_recs(name)), target)
    assert _master_for(cluster, name) is target
    assert holder.release(held)
    thread.join(60)
    assert outcome and isinstance(outcome[0], Lease), outcome
    got = outcome[0]
    assert got.token > held.token
    # Confirmed on the replica of the slot's new master.
    assert _has(_replica_of(cluster, target), name, got.id)
    assert waiter.release(got)
    readers_quiet(waiter)
    client.close()


def test_master_failover_keeps_confirmed_leases(cluster: LocalCluster) -> None:
    client = _client(cluster)
    name = f"failover-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name, min_replicas=1, replica_timeout=5.0)
    pool.extend(["r", "s"])
    held = pool.acquire(timeout=5)
    blocker = pool.acquire(timeout=5)
    waiter = FairAllocator(_client(cluster), name, min_replicas=1, replica_timeout=5.0)
    outcome: list[Any] = []
    thread = _wait_in_thread(waiter, outcome)
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    master = _master_for(cluster, name)
    replica = _replica_of(cluster, master)
    cluster.failover(replica)
    assert _master_for(cluster, name) is replica
    # The confirmed leases are on the new master: renewed there, confirmed
    # by the old master, now its replica.
    renewed = _retry(lambda: pool.renew(held, ttl=120))
    assert renewed.token == held.token
    assert _retry(lambda: pool.release(blocker))
    thread.join(60)
    assert outcome and isinstance(outcome[0], Lease), outcome
    got = outcome[0]
    assert got.resource == blocker.resource and got.token > blocker.token
    assert _has(master, name, got.id)  # the old master, a replica now
    assert waiter.release(got) and pool.release(renewed)
    status = pool.status()
    assert status.free == status.size == 2 and status.waiting == 0
    readers_quiet(waiter)
    client.close()


def _retry(call: Any, attempts: int = 100) -> Any:
    """Until the cluster client follows the failover (its retries give up
    on a node that answered READONLY or went away; the next call finds the
    new master)."""
    import time

    for attempt in range(attempts):
        try:
            return call()
        except (NotReplicated, redis.RedisError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")
