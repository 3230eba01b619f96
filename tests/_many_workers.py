"""Worker processes for tests/test_many.py (importable by the ``spawn`` method).

Each one is a separate client of the pool, with its own client id and
liveness mark; the parent's handle is ``_workers.Proc`` (command and report
queues of its own, appended to the arguments).
"""

from __future__ import annotations

import json
import os
import queue
import random
import time
from typing import Any

import redis

from allocator import AcquireTimeout, FairAllocator, LeaseLost


def _pool(url: str, name: str, lease_ttl: float = 60.0) -> tuple[Any, FairAllocator]:
    client = redis.Redis.from_url(url)
    return client, FairAllocator(client, name, lease_ttl=lease_ttl)


def server_now(client: Any) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def many_leaser(
    url: str,
    name: str,
    count: int,
    inbox: Any,
    outbox: Any,
    timeout: float | None = 60.0,
    ttl: float | None = None,
    wait_go: bool = False,
) -> None:
    """``acquire_many(count)`` once, report, then carry out commands.

    Reports ``("ready", pid)``; with ``wait_go`` it then waits for ``"go"``.
    Then ``("granted", leases)``, ``("timeout", waited)`` or
    ``("interrupted", None)`` (SIGINT while waiting). Commands:
    ``"release"`` -> ``("released", [bool, ...])`` and the worker ends;
    ``"exit"``: end without releasing.
    """
    _client, pool = _pool(url, name)
    outbox.put(("ready", os.getpid()))
    if wait_go:
        assert inbox.get() == "go"
    try:
        leases = pool.acquire_many(count, timeout, ttl=ttl)
    except AcquireTimeout as exc:
        outbox.put(("timeout", exc.waited))
        return
    except KeyboardInterrupt:
        outbox.put(("interrupted", None))
        return
    outbox.put(("granted", leases))
    while True:
        command = inbox.get()
        if command == "release":
            outbox.put(("released", [pool.release(lease) for lease in leases]))
            return
        if command == "exit":
            return
        raise ValueError(f"unknown command {command!r}")


def churner(
    url: str, name: str, count: int, inbox: Any, outbox: Any, expire: float | None = None
) -> None:
    """Acquire ``count`` (``acquire`` for 1), release, again and again, until
    told ``"stop"``; reports ``("round", 1)`` after its first round and
    ``("stopped", rounds)`` at the end. With ``expire`` (a ttl), it never
    releases: its leases end by expiry, all of a grant at once."""
    _client, pool = _pool(url, name)
    rounds = 0
    while True:
        try:
            command = inbox.get_nowait()
        except queue.Empty:
            command = None
        if command == "stop":
            outbox.put(("stopped", rounds))
            return
        try:
            if count == 1:
                leases = [pool.acquire(timeout=5, ttl=expire)]
            else:
                leases = pool.acquire_many(count, 5, ttl=expire)
        except AcquireTimeout:
            continue
        if expire is None:
            for lease in leases:
                pool.release(lease)
        rounds += 1
        if rounds == 1:
            outbox.put(("round", 1))


def _write(ledger: Any, record: dict[str, Any]) -> None:
    ledger.write(json.dumps(record) + "\n")
    ledger.flush()
    os.fsync(ledger.fileno())


def chaos_many_worker(
    url: str, name: str, ledger_path: str, seed: int, stop: Any, ttl: float, hold: float
) -> None:
    """Like ``_workers.chaos_worker``, with requests for 1 to 3 resources at
    random (``acquire`` or ``acquire_many``). Every lease of a grant goes in
    the ledger as it happens, fsync'ed: ``begin`` records (one per lease,
    with the grant's ``group``, its ``count``, and the server time ``start``
    read after acquire returned), then per lease ``end`` (before release)
    and ``release`` (its result)."""
    client, pool = _pool(url, name, ttl)
    rng = random.Random(seed)
    group = 0
    with open(ledger_path, "a", encoding="utf-8") as ledger:
        while not stop.value:
            count = rng.choice((1, 1, 2, 3))
            try:
                if count == 1 and rng.random() < 0.5:
                    leases = [pool.acquire(timeout=2.0, ttl=ttl)]
                else:
                    leases = pool.acquire_many(count, timeout=2.0, ttl=ttl)
            except AcquireTimeout:
                continue
            group += 1
            start = server_now(client)
            for lease in leases:
                _write(ledger, {
                    "kind": "begin", "pid": os.getpid(), "group": group, "count": count,
                    "resource": lease.resource, "token": lease.token,
                    "granted_at": lease.granted_at, "expires_at": lease.expires_at,
                    "start": start,
                })  # fmt: skip
            time.sleep(rng.uniform(0, hold))
            if rng.random() < 0.3:
                for i, lease in enumerate(leases):
                    try:
                        leases[i] = pool.renew(lease)
                    except LeaseLost:
                        continue
                    _write(ledger, {
                        "kind": "renew", "token": lease.token, "resource": lease.resource,
                        "expires_at": leases[i].expires_at,
                    })  # fmt: skip
                time.sleep(rng.uniform(0, hold))
            end = server_now(client)
            for lease in leases:
                _write(ledger, {
                    "kind": "end", "token": lease.token, "resource": lease.resource, "end": end,
                })  # fmt: skip
            for lease in leases:
                _write(ledger, {
                    "kind": "release", "token": lease.token, "resource": lease.resource,
                    "released": pool.release(lease),
                })  # fmt: skip
