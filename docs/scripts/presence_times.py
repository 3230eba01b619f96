"""How soon those behind a dead waiter are served, and how soon a dead
holder is shown gone (docs/concepts.md, 'Liveness marks, presence and dead
waiters').

    python docs/scripts/presence_times.py            # 20 runs of each
    python docs/scripts/presence_times.py --runs 5

A private redis-server from PATH. Each run: the script holds the pool's one
resource; waiter A (a process) queues, then waiter B; A is SIGKILLed and the
resource released at once; the time from the later of the two to B's grant
is read on the server's clock. Then a holder process is SIGKILLed and the
time until ``status().absent_holders`` shows it is measured. Last, a holder
with ``reclaim_on_disconnect`` is SIGKILLed while a waiter (a process)
waits, and the time from the kill to the waiter's grant is read on the
server's clock. Prints p50 and the maximum of each.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import time
import uuid
from typing import Any

import redis

from allocator import FairAllocator
from allocator._server import RedisServer

CTX = multiprocessing.get_context("spawn")


def now(client: Any) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def waiter(url: str, name: str, out: Any) -> None:
    pool = FairAllocator(redis.Redis.from_url(url), name)
    lease = pool.acquire(timeout=60)
    out.put(lease.granted_at)
    pool.release(lease)


def holder(url: str, name: str, out: Any, reclaim: bool = False) -> None:
    pool = FairAllocator(redis.Redis.from_url(url), name, reclaim_on_disconnect=reclaim)
    pool.acquire(timeout=60)
    out.put("held")
    time.sleep(3600)


def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.005)


def dead_waiter(url: str, client: Any) -> float:
    name = f"pt-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    outs, procs = [], []
    for waiting in (1, 2):
        out = CTX.Queue()
        proc = CTX.Process(target=waiter, args=(url, name, out), daemon=True)
        proc.start()
        until(lambda w=waiting: pool.status().waiting == w)
        outs.append(out)
        procs.append(proc)
    os.kill(procs[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
    procs[0].join()
    killed = now(client)
    pool.release(held)
    released = now(client)
    granted = outs[1].get(timeout=60)
    procs[1].join()
    return float(granted - max(killed, released))


def dead_holder(url: str, client: Any) -> float:
    name = f"pt-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    out = CTX.Queue()
    proc = CTX.Process(target=holder, args=(url, name, out), daemon=True)
    proc.start()
    out.get(timeout=30)
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join()
    killed = time.monotonic()
    until(lambda: pool.status().absent_holders == 1)
    return time.monotonic() - killed


def reclaimed_holder(url: str, client: Any) -> float:
    name = f"pt-{uuid.uuid4().hex[:8]}"
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    out = CTX.Queue()
    proc = CTX.Process(target=holder, args=(url, name, out, True), daemon=True)
    proc.start()
    out.get(timeout=30)
    granted = CTX.Queue()
    next_one = CTX.Process(target=waiter, args=(url, name, granted), daemon=True)
    next_one.start()
    until(lambda: pool.status().waiting == 1)
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join()
    killed = now(client)
    at = granted.get(timeout=60)
    next_one.join()
    return float(at - killed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        for what, measure in (("dead waiter -> next grant", dead_waiter),
                              ("dead holder -> shown gone", dead_holder),
                              ("dead holder, reclaim_on_disconnect -> next grant",
                               reclaimed_holder)):  # fmt: skip
            times = [measure(server.url, client) for _ in range(runs)]
            print(
                f"{what}: p50 {statistics.median(times):.2f} s, max {max(times):.2f} s "
                f"({runs} runs)"
            )
        client.close()


if __name__ == "__main__":
    main()
