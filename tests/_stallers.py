"""Worker processes for tests/test_liveness.py (importable by 'spawn').

Each waits in line for one lease, and on the command ``"stall"`` freezes its
own client for a while the way real programs do: a C call that holds the GIL
(sync), or blocking code on the event loop (asyncio)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import threading
import time
from typing import Any

import redis

from allocator import AsyncFairAllocator, FairAllocator


def _hold_the_gil(seconds: float) -> None:
    # PyDLL does not release the GIL around the call: no thread of this
    # process runs Python until it returns (the reader thread included).
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    libc.usleep(ctypes.c_uint(int(seconds * 1_000_000)))


def gil_waiter(url: str, name: str, stall: float, inbox: Any, outbox: Any) -> None:
    pool = FairAllocator(redis.Redis.from_url(url), name)

    def on_command() -> None:
        assert inbox.get() == "stall"
        outbox.put(("stalling", os.getpid()))
        _hold_the_gil(stall)
        outbox.put(("resumed", None))

    threading.Thread(target=on_command, daemon=True).start()
    outbox.put(("ready", os.getpid()))
    lease = pool.acquire(timeout=60)
    outbox.put(("granted", lease))
    assert inbox.get() == "release"
    outbox.put(("released", pool.release(lease)))


def loop_waiter(url: str, name: str, stall: float, inbox: Any, outbox: Any) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url)
        pool = AsyncFairAllocator(client, name)
        loop = asyncio.get_running_loop()

        async def on_command() -> None:
            assert await loop.run_in_executor(None, inbox.get) == "stall"
            outbox.put(("stalling", os.getpid()))
            time.sleep(stall)  # blocks the event loop, reader task included
            outbox.put(("resumed", None))

        chore = loop.create_task(on_command())
        outbox.put(("ready", os.getpid()))
        lease = await pool.acquire(timeout=60)
        outbox.put(("granted", lease))
        await chore
        assert await loop.run_in_executor(None, inbox.get) == "release"
        outbox.put(("released", await pool.release(lease)))
        await client.aclose()

    asyncio.run(main())


def churner(url: str, name: str, ledger: str, seed: int, inbox: Any, outbox: Any) -> None:
    """Lease and release until told to stop; every lease goes into an
    fsync'ed ledger of this worker's own with its ticket, grant time, and the
    server time just before its release. Reports ``("done", rounds)``."""
    import json
    import random

    client = redis.Redis.from_url(url)
    pool = FairAllocator(client, name, lease_ttl=60)
    rng = random.Random(seed)
    rounds = 0
    outbox.put(("ready", os.getpid()))
    with open(ledger, "a", encoding="utf-8") as out:
        while inbox.empty():
            lease = pool.acquire(timeout=120)
            time.sleep(rng.uniform(0, 0.02))
            seconds, micros = client.time()
            record = {
                "resource": lease.resource, "token": lease.token, "ticket": lease.ticket,
                "granted_at": lease.granted_at, "left": int(seconds) + int(micros) / 1e6,
            }  # fmt: skip
            record["released"] = pool.release(lease)
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
            rounds += 1
    outbox.put(("done", rounds))
