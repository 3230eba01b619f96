"""Presence under crowds and churn (docs/performance.md, "Presence").

    python docs/scripts/presence_crowd.py crowd            # 100 clients, 2,000 waiters
    python docs/scripts/presence_crowd.py crowd --clients 20 --waiters 10
    python docs/scripts/presence_crowd.py churn            # 15 s
    python docs/scripts/presence_crowd.py idle             # commands of an idle waiter

A private redis-server from PATH (``--url`` for another; never a shared one).

``crowd``: the script holds the pool's one resource; ``--clients`` asyncio
clients, each with ``--waiters`` waiting tasks, queue in processes of 20
clients each, then one live waiter (a process); every crowd process is
SIGKILLed and the resource released at once. Prints the time from the kill
(once the server dropped their presences) to the live waiter's grant, on
the server's clock, and the longest script run meanwhile (``SLOWLOG``).

``churn``: 8 worker processes share 3 resources (lease ttl 1 s, holds of
5-50 ms, acquire timeout 10 s); every 0.35-0.65 s one of them is SIGKILLed
and replaced, for ``--seconds``. Prints the grants and the acquires that
timed out.

``idle``: one process waits for ``--seconds``; prints the commands it sent
(``MONITOR``), per second.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import signal
import time
import uuid
from typing import Any

import redis
import redis.asyncio

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator
from allocator._server import RedisServer

CTX = multiprocessing.get_context("spawn")


def now(client: Any) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def crowd_process(url: str, name: str, clients: int, waiters: int, out: Any) -> None:
    async def run() -> None:
        pools = [
            AsyncFairAllocator(redis.asyncio.Redis.from_url(url), name) for _ in range(clients)
        ]
        tasks = [asyncio.create_task(p.acquire(600)) for p in pools for _ in range(waiters)]
        out.put("ready")
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


def live_waiter(url: str, name: str, out: Any) -> None:
    pool = FairAllocator(redis.Redis.from_url(url), name)
    lease = pool.acquire(timeout=600)
    out.put(lease.granted_at)
    pool.release(lease)


def subscribed(client: Any) -> int:
    return sum(
        1 for c in client.client_list() if int(c.get("ssub", 0) or 0) + int(c.get("sub", 0)) > 0
    )


def until(check: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.01)


def crowd(url: str, clients: int, waiters: int) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    name = f"crowd-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    out = CTX.Queue()
    procs = []
    for start in range(0, clients, 20):
        proc = CTX.Process(
            target=crowd_process, args=(url, name, min(20, clients - start), waiters, out)
        )
        proc.start()
        procs.append(proc)
    for _ in procs:
        out.get(timeout=120)
    until(lambda: pool.status().waiting >= clients * waiters)
    live = CTX.Process(target=live_waiter, args=(url, name, out))
    live.start()
    until(lambda: pool.status().waiting == clients * waiters + 1)
    client.config_set("slowlog-log-slower-than", "1000")
    client.slowlog_reset()
    before = subscribed(client)
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
    until(lambda: subscribed(client) <= before - clients)
    killed = now(client)
    pool.release(held)
    if os.environ.get("CROWD_TRACE"):  # the queue as it drains, every 0.5 s
        while out.empty():
            st = pool.status()
            print(
                f"{now(client) - killed:6.2f} waiting={st.waiting} "
                f"leased={st.leased} free={st.free}",
                flush=True,
            )
            time.sleep(0.5)
    granted = out.get(timeout=600)
    longest = max((entry["duration"] for entry in client.slowlog_get(128)), default=0)
    print(
        f"crowd: {clients} clients, {clients * waiters} waiters killed: the live waiter "
        f"served {granted - killed:.2f} s after the kill; longest script run "
        f"{longest / 1000:.1f} ms (SLOWLOG, runs over 1 ms)"
    )
    live.join(30)
    for proc in procs:
        proc.join(10)


def churn_worker(url: str, name: str, counts: Any) -> None:
    pool = FairAllocator(redis.Redis.from_url(url), name, lease_ttl=1.0)
    while True:
        try:
            lease = pool.acquire(timeout=10)
        except AcquireTimeout:
            with counts.get_lock():
                counts[1] += 1
            continue
        with counts.get_lock():
            counts[0] += 1
        time.sleep(random.uniform(0.005, 0.05))
        pool.release(lease)


def churn(url: str, seconds: float) -> None:
    client = redis.Redis.from_url(url)
    name = f"churn-{uuid.uuid4().hex[:8]}"
    FairAllocator(client, name).extend(["a", "b", "c"])
    counts = CTX.Array("l", [0, 0])
    workers = [CTX.Process(target=churn_worker, args=(url, name, counts)) for _ in range(8)]
    for proc in workers:
        proc.start()
    time.sleep(2.0)  # all started and queued
    with counts.get_lock():
        counts[0] = counts[1] = 0
    end = time.monotonic() + seconds
    kills = 0
    while time.monotonic() < end:
        time.sleep(random.uniform(0.35, 0.65))
        victim = workers.pop(random.randrange(len(workers)))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        kills += 1
        fresh = CTX.Process(target=churn_worker, args=(url, name, counts))
        fresh.start()
        workers.append(fresh)
    with counts.get_lock():
        grants, timeouts = counts[0], counts[1]
    for proc in workers:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    print(
        f"churn: {seconds:.0f} s, {kills} workers killed: {grants} grants, "
        f"{timeouts} acquires timed out"
    )


def idle(url: str, seconds: float) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    name = f"idle-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    out = CTX.Queue()
    proc = CTX.Process(target=live_waiter, args=(url, name, out))
    proc.start()
    until(lambda: pool.status().waiting == 1)
    time.sleep(1.0)
    pids = {c["id"]: c["addr"] for c in client.client_list()}
    seen: list[str] = []
    with client.monitor() as monitor:
        end = time.monotonic() + seconds
        for event in monitor.listen():
            seen.append(f"{event['client_address']}:{event['client_port']}")
            if time.monotonic() > end:
                break
    theirs = {addr for cid, addr in pids.items() if cid != str(client.client_id())}
    sent = sum(1 for addr in seen if addr in theirs)
    print(
        f"idle: a waiting process sent {sent} commands in {seconds:.0f} s ({sent / seconds:.2f}/s)"
    )
    pool.release(held)
    out.get(timeout=30)
    proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["crowd", "churn", "idle"])
    parser.add_argument("--url", help="a Redis of your own (default: a private one)")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--waiters", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    if args.url:
        run(args, args.url)
        return
    with RedisServer() as server:
        run(args, server.url)


def run(args: argparse.Namespace, url: str) -> None:
    if args.what == "crowd":
        crowd(url, args.clients, args.waiters)
    elif args.what == "churn":
        churn(url, args.seconds)
    else:
        idle(url, args.seconds)


if __name__ == "__main__":
    main()
