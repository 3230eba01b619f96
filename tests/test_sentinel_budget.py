"""Single calls on a Sentinel-managed client ride out a failover
(docs/operations.md#sentinel): ``release`` and ``renew`` made the moment the master dies (SIGKILL)
or hangs (SIGSTOP) return once Sentinel has promoted a replica, instead of
raising ``MasterNotFoundError`` when the plain 2 s budget runs out.

The Sentinels here deem a master down after 3 s of silence, so a failover
takes longer than the plain budget (``RETRY_BUDGET``) every time; the budget
of a Sentinel-managed client (``FAILOVER_BUDGET``) outlasts a failover with
Sentinel's defaults (30 s to deem the master down). A hung plain server keeps
the 2 s budget (tests/test_hung_server.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from _replication import MASTER, Replicated, Sentinels
from helpers import Background, LoopThread

from allocator import AsyncFairAllocator, FairAllocator
from allocator._core.retry import FAILOVER_BUDGET, RETRY_BUDGET

pytestmark = [pytest.mark.real_redis, pytest.mark.replicas]

#: Sentinel's down-after-milliseconds here: longer than RETRY_BUDGET.
DOWN_AFTER_MS = 3000


@pytest.fixture
def sentinel_set() -> Iterator[tuple[Replicated, Sentinels]]:
    with (
        Replicated(replicas=2) as replicated,
        Sentinels(replicated, down_after=DOWN_AFTER_MS) as sentinels,
    ):
        yield replicated, sentinels


async def _async_sentinel(sentinels: Sentinels) -> Any:
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    return AsyncSentinel(sentinels.addresses, socket_timeout=2.0)


async def _async_close(manager: Any, client: Any) -> None:
    await client.aclose()
    for each in manager.sentinels:
        await each.aclose()


def test_only_sentinel_clients_get_the_failover_budget() -> None:
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel
    from redis.sentinel import Sentinel

    # Made without I/O: nothing listens at these addresses.
    managed = Sentinel([("127.0.0.1", 1)]).master_for(MASTER)
    amanaged = AsyncSentinel([("127.0.0.1", 1)]).master_for(MASTER)
    assert FairAllocator(managed, "p")._pool.call_budget == FAILOVER_BUDGET
    assert AsyncFairAllocator(amanaged, "p")._pool.call_budget == FAILOVER_BUDGET
    plain = FairAllocator(redis.Redis(port=1), "p")._pool
    aplain = AsyncFairAllocator(redis.asyncio.Redis(port=1), "p")._pool
    assert plain.call_budget == aplain.call_budget == RETRY_BUDGET
    assert plain.try_budget is None and aplain.try_budget is None


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_release_and_renew_ride_out_a_failover(
    sentinel_set: tuple[Replicated, Sentinels], pool_name: str, fault: str
) -> None:
    from redis.sentinel import Sentinel

    replicated, sentinels = sentinel_set
    manager = Sentinel(sentinels.addresses, socket_timeout=2.0)
    client = manager.master_for(MASTER, socket_timeout=5.0)
    # Every grant confirmed by both replicas: whichever is promoted has it.
    confirmed = FairAllocator(client, pool_name, min_replicas=2, replica_timeout=2.0)
    confirmed.extend(["a", "b", "c", "d"])
    leases = [confirmed.acquire(timeout=5) for _ in range(4)]
    pool = FairAllocator(client, pool_name)
    loop = LoopThread()
    amanager = loop.run(_async_sentinel(sentinels))
    aclient = amanager.master_for(MASTER, socket_timeout=5.0)
    apool = AsyncFairAllocator(aclient, pool_name)
    old = sentinels.master_address()
    with redis.Redis(host=old[0], port=old[1]) as primary:
        pid = int(primary.info("server")["process_id"])
    started = time.monotonic()
    if fault == "kill":
        replicated.primary.stop(kill=True)
    else:
        os.kill(pid, signal.SIGSTOP)
    try:
        calls = {
            "release": Background(lambda: pool.release(leases[0])),
            "renew": Background(lambda: pool.renew(leases[1], ttl=60)),
            "async release": Background(lambda: loop.run(apool.release(leases[2]), 90)),
            "async renew": Background(lambda: loop.run(apool.renew(leases[3], ttl=60), 90)),
        }
        # Each raises here what its call raised (MasterNotFoundError before
        # the budget outlasted a failover).
        done = {name: call.join(90) for name, call in calls.items()}
        took = time.monotonic() - started
    finally:
        if fault == "stop":
            os.kill(pid, signal.SIGCONT)
    print(f"{fault}: release and renew returned {took:.1f} s after the fault")
    assert sentinels.master_address() != old
    assert done["release"] is True and done["async release"] is True
    for name, lease in (("renew", leases[1]), ("async renew", leases[3])):
        assert (done[name].resource, done[name].token) == (lease.resource, lease.token)
    assert pool.release(done["renew"]) and loop.run(apool.release(done["async renew"]))
    assert pool.status().leased == 0
    loop.run(_async_close(amanager, aclient))
    loop.close()
    client.close()
    for each in manager.sentinels:
        each.close()
