"""Code that runs in the benchmark's worker processes.

Three kinds of process: a *contended worker* loops acquire / hold / release on a
pool (the library's, or the token-list baseline) and reports every grant; the
*waiters helper* parks thousands of asyncio tasks on one ``AsyncFairAllocator``
and, once released, reports the order in which they were served; a *tenants
worker* is one of the two tenants of the ``tenants`` scenario (bursts, or a
lone request now and then).

Both talk to the parent over a ``multiprocessing`` pipe and never raise: an
error travels back as ``("error", traceback_text)``. The entry points are
top-level functions so that the ``spawn`` start method can import them.
Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC on Linux, one clock for all
processes of the machine, so grants seen by different workers can be ordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import attrs
import redis
import redis.asyncio

from allocator.cli.bench.stats import GrantSample

__all__ = [
    "ContendedSpec",
    "TenantsSpec",
    "WaitersSpec",
    "contended_worker",
    "sync_client",
    "tenants_worker",
    "waiters_helper",
]

LIBRARY = "library"
TOKENS = "tokens"

# Above every wait the benchmark asks for, so that a stuck call turns into an
# error instead of hanging the run.
SOCKET_TIMEOUT = 120.0


def sync_client(url: str, cluster: bool, **options: Any) -> Any:
    """A blocking client on ``url``: a ``RedisCluster`` when the server is a
    cluster node (the parent found out, as the other commands do)."""
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


@attrs.frozen
class ContendedSpec:
    """What a contended worker does. ``kind`` is ``"library"`` or ``"tokens"``.

    For ``"library"`` ``target`` is the pool name; for ``"tokens"`` it is the
    key of the Redis list holding the free resources.
    """

    kind: str
    url: str
    target: str
    prefix: str
    hold_s: float
    run_ns: int
    acquire_timeout: float
    lease_ttl: float
    client_name: str
    cluster: bool = False


def contended_worker(index: int, spec: ContendedSpec, conn: Connection) -> None:
    """Process entry: handshake, loop until the shared deadline, send the grants.

    Protocol: send ``("ready", None)``; receive the start time (monotonic ns);
    run until start + ``run_ns``; send ``("done", {"samples": [...],
    "errors": [...]})``. A worker stops taking new grants at the deadline but
    keeps releasing, so the others drain and exit too.
    """
    try:
        client = sync_client(
            spec.url, spec.cluster, socket_timeout=SOCKET_TIMEOUT, client_name=spec.client_name
        )
        client.ping()
        runner = _library_loop if spec.kind == LIBRARY else _tokens_loop
        conn.send(("ready", None))
        start_ns = conn.recv()
        if not isinstance(start_ns, int):
            return
        delay = start_ns - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        samples, errors = runner(index, spec, client, start_ns + spec.run_ns)
        conn.send(("done", {"samples": samples, "errors": errors}))
    except BaseException:
        _send_error(conn)
    finally:
        conn.close()


def _library_loop(
    index: int, spec: ContendedSpec, client: Any, stop_ns: int
) -> tuple[list[GrantSample], list[str]]:
    from allocator import AcquireTimeout, FairAllocator

    pool = FairAllocator(client, spec.target, lease_ttl=spec.lease_ttl, prefix=spec.prefix)
    samples: list[GrantSample] = []
    errors: list[str] = []
    now = time.monotonic_ns
    hold = spec.hold_s
    while True:
        t_wait = now()
        if t_wait >= stop_ns:
            break
        try:
            lease = pool.acquire(timeout=spec.acquire_timeout)
        except AcquireTimeout as exc:
            errors.append(f"acquire timed out: {exc}")
            continue
        t_acquired = now()
        time.sleep(hold)
        t_release = now()
        released = pool.release(lease)
        t_released = now()
        if not released:
            errors.append(f"release of {lease.resource} token {lease.token} returned False")
        samples.append(
            GrantSample(
                index,
                t_wait,
                t_acquired,
                t_release,
                t_released,
                lease.resource,
                lease.token,
                lease.ticket,
                lease.granted_at,
            )
        )
    return samples, errors


def _tokens_loop(
    index: int, spec: ContendedSpec, client: Any, stop_ns: int
) -> tuple[list[GrantSample], list[str]]:
    """The baseline: free resources in a list, acquire = BLPOP, release = RPUSH."""
    samples: list[GrantSample] = []
    errors: list[str] = []
    now = time.monotonic_ns
    hold = spec.hold_s
    key = spec.target
    timeout = max(1, round(spec.acquire_timeout))
    while True:
        t_wait = now()
        if t_wait >= stop_ns:
            break
        reply = client.blpop([key], timeout=timeout)
        if reply is None:
            errors.append("BLPOP timed out")
            continue
        t_acquired = now()
        value = reply[1]
        resource = value.decode() if isinstance(value, bytes) else str(value)
        time.sleep(hold)
        t_release = now()
        client.rpush(key, resource)
        t_released = now()
        samples.append(GrantSample(index, t_wait, t_acquired, t_release, t_released, resource))
    return samples, errors


def _send_error(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        conn.send(("error", traceback.format_exc()))


# --- the waiters helper ------------------------------------------------------


@attrs.frozen
class WaitersSpec:
    """One process of many asyncio waiters on one pool."""

    url: str
    pool: str
    prefix: str
    client_name: str
    max_connections: int
    wait_timeout: float
    lease_ttl: float
    cluster: bool = False


def waiters_helper(spec: WaitersSpec, conn: Connection) -> None:
    """Process entry for the asyncio waiters.

    Protocol (parent -> helper / helper -> parent):
    ``("enqueue", k)`` starts ``k`` more waiting tasks and answers
    ``("enqueued", {"waiting": w, "tasks": n, "seconds": s})`` once the pool
    reports that many waiting; ``("finish", timeout)`` waits for every task to
    be served (each releases at once) and answers ``("done", {...})``;
    ``("quit", None)`` cancels what is left.
    """
    try:
        asyncio.run(_waiters_main(spec, conn))
    except BaseException:
        _send_error(conn)
    finally:
        conn.close()


async def _waiters_main(spec: WaitersSpec, conn: Connection) -> None:
    from allocator import AsyncFairAllocator

    # A bounded pool: enqueueing thousands of tasks at once would otherwise
    # open one connection per in-flight call. Waiting must not need them.
    client: Any
    cpool: Any = None
    if spec.cluster:
        from redis.asyncio.cluster import RedisCluster

        # Its pools do not block when full (they raise): the tasks are
        # started a few at a time instead (_start), and a little room is
        # left for the library's reader.
        client = RedisCluster.from_url(
            spec.url,
            max_connections=spec.max_connections + 4,
            socket_timeout=SOCKET_TIMEOUT,
            client_name=spec.client_name,
        )
    else:
        cpool = redis.asyncio.BlockingConnectionPool.from_url(
            spec.url,
            max_connections=spec.max_connections,
            timeout=SOCKET_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
            client_name=spec.client_name,
        )
        client = redis.asyncio.Redis(connection_pool=cpool)
    apool = AsyncFairAllocator(client, spec.pool, lease_ttl=spec.lease_ttl, prefix=spec.prefix)
    grants: list[tuple[int, str, float, int, int]] = []
    errors: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def waiter(i: int) -> None:
        try:
            lease = await apool.acquire(timeout=spec.wait_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"task {i}: {exc!r}")
            return
        grants.append((i, lease.ticket, lease.granted_at, lease.token, time.monotonic_ns()))
        try:
            await apool.release(lease)
        except Exception as exc:
            errors.append(f"task {i} release: {exc!r}")

    try:
        await client.ping()
        conn.send(("ready", None))
        while True:
            if not conn.poll():
                await asyncio.sleep(0.005)
                continue
            cmd, arg = conn.recv()
            if cmd == "enqueue":
                t0 = time.monotonic()
                # All at once where the connection pool blocks when full;
                # else (a cluster) a pool's worth at a time, each batch queued
                # before the next starts.
                batch = spec.max_connections if spec.cluster else int(arg)
                left = int(arg)
                waiting: int | None = None
                while left > 0:
                    for _ in range(min(batch, left)):
                        tasks.append(asyncio.ensure_future(waiter(len(tasks))))
                    left -= batch
                    waiting = await _wait_for_waiting(apool, tasks, deadline=t0 + 120.0)
                conn.send(
                    (
                        "enqueued",
                        {
                            "waiting": waiting,
                            "tasks": len(tasks),
                            "seconds": time.monotonic() - t0,
                            "errors": list(errors),
                        },
                    )
                )
            elif cmd == "finish":
                t0 = time.monotonic()
                pending: Any = set()
                if tasks:
                    _, pending = await asyncio.wait(tasks, timeout=float(arg))
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
                conn.send(
                    (
                        "done",
                        {
                            "grants": grants,
                            "errors": errors,
                            "unfinished": len(pending),
                            "seconds": time.monotonic() - t0,
                        },
                    )
                )
                return
            else:
                return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
        if cpool is not None:
            await cpool.disconnect()


async def _wait_for_waiting(
    apool: Any, tasks: list[asyncio.Task[None]], deadline: float
) -> int | None:
    """Poll the pool's status until every task waits, has ended, or the deadline."""
    waiting: int | None = None
    while time.monotonic() < deadline:
        status = await apool.status()
        waiting = int(status.waiting)
        if waiting + sum(1 for t in tasks if t.done()) >= len(tasks):
            return waiting
        await asyncio.sleep(0.02)
    return waiting


# --- the two tenants ---------------------------------------------------------


@attrs.frozen
class TenantsSpec:
    """One of the two tenants of the ``tenants`` scenario on one pool: the
    ``burst`` one queues ``burst`` requests at once, again as soon as they
    are served; the ``lone`` one a request every ``gap_s``. Each request
    holds its lease ``hold_s``."""

    role: str
    url: str
    pool: str
    prefix: str
    burst: int
    hold_s: float
    gap_s: float
    run_ns: int
    client_name: str
    cluster: bool = False


def tenants_worker(spec: TenantsSpec, conn: Connection) -> None:
    """Process entry: as :func:`contended_worker` (``ready``, the start
    time, ``done``), reporting ``{"grants": n, "waits_ns": [...] (the lone
    tenant's), "errors": [...]}``."""
    try:
        from allocator import FairAllocator

        client = sync_client(
            spec.url, spec.cluster, socket_timeout=SOCKET_TIMEOUT, client_name=spec.client_name
        )
        client.ping()
        pool = FairAllocator(client, spec.pool, prefix=spec.prefix, tenant=spec.role)
        # One request before the run, so that the client's reader and
        # presence are set up before a burst's threads all start at once.
        pool.release(pool.acquire(timeout=SOCKET_TIMEOUT))
        conn.send(("ready", None))
        start_ns = conn.recv()
        if not isinstance(start_ns, int):
            return
        delay = start_ns - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        stop_ns = start_ns + spec.run_ns
        run = _burst_loop if spec.role == "burst" else _lone_loop
        conn.send(("done", run(pool, spec, stop_ns)))
    except BaseException:
        _send_error(conn)
    finally:
        conn.close()


def _burst_loop(pool: Any, spec: TenantsSpec, stop_ns: int) -> dict[str, Any]:
    import threading

    grants: list[int] = []
    errors: list[str] = []

    def one() -> None:
        try:
            lease = pool.acquire(timeout=SOCKET_TIMEOUT)
            time.sleep(spec.hold_s)
            pool.release(lease)
            grants.append(1)
        except Exception as exc:
            errors.append(repr(exc))

    while time.monotonic_ns() < stop_ns:
        threads = [threading.Thread(target=one, daemon=True) for _ in range(spec.burst)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {"grants": len(grants), "waits_ns": [], "errors": errors}


def _lone_loop(pool: Any, spec: TenantsSpec, stop_ns: int) -> dict[str, Any]:
    waits: list[int] = []
    errors: list[str] = []
    while True:
        time.sleep(spec.gap_s)
        t_wait = time.monotonic_ns()
        if t_wait >= stop_ns:
            break
        try:
            lease = pool.acquire(timeout=SOCKET_TIMEOUT)
        except Exception as exc:
            errors.append(repr(exc))
            continue
        waits.append(time.monotonic_ns() - t_wait)
        time.sleep(spec.hold_s)
        pool.release(lease)
    return {"grants": len(waits), "waits_ns": waits, "errors": errors}
