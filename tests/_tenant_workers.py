"""Worker processes for tests/test_tenants.py (importable by 'spawn'): one
client of a pool per process, whose requests run in threads of their own
and name the tenant the test says. The test drives each worker through its
inbox and reads what happened from its outbox (tests/_workers.py ``Proc``).
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from allocator import FairAllocator


def tenant_client(url: str, name: str, inbox: Any, outbox: Any) -> None:
    """Commands (tuples):

    - ``("warm",)``: one acquire and release (a resource must be free);
      reports ``("warm", None)``;
    - ``("queue", tag, tenant, hold)``: a thread acquires for ``tenant`` and
      reports ``("granted", grant)`` (a dict: tag, tenant, token, ticket,
      resource); with ``hold``, it keeps the lease until ``("release", tag)``
      and then reports ``("released", tag)``, else it releases at once;
    - ``("queue_many", tag, tenant, count, hold)``: the same for ``count``
      resources at once (``grant`` then has ``tokens`` and ``resources``);
    - ``("sustain", tenant, threads)``: that many threads acquire and
      release for ``tenant`` again and again, each grant reported, until
      ``("stop",)``;
    - ``("stop",)``: end the sustained threads, let every thread finish, and
      report ``("stopped", None)``.
    """
    client = redis.Redis.from_url(url)
    pool = FairAllocator(client, name)
    gates: dict[str, threading.Event] = {}
    threads: list[threading.Thread] = []
    stop = threading.Event()

    def report(kind: str, payload: Any) -> None:
        outbox.put((kind, payload))

    def one(tag: str, tenant: str, hold: bool, count: int | None) -> None:
        try:
            if count is None:
                leases = [pool.acquire(timeout=120, tenant=tenant)]
            else:
                leases = pool.acquire_many(count, timeout=120, tenant=tenant)
            report(
                "granted",
                {
                    "tag": tag,
                    "tenant": tenant,
                    "token": leases[0].token,
                    "ticket": leases[0].ticket,
                    "resource": leases[0].resource,
                    "tokens": [lease.token for lease in leases],
                    "resources": [lease.resource for lease in leases],
                },
            )
            if hold:
                gates[tag].wait()
            for lease in leases:
                assert pool.release(lease), f"{tag}: lease lost while held"
            if hold:
                report("released", tag)
        except BaseException as exc:
            report("error", f"{tag}: {exc!r}")

    def sustain(tenant: str) -> None:
        try:
            while not stop.is_set():
                lease = pool.acquire(timeout=120, tenant=tenant)
                report(
                    "granted",
                    {"tag": "", "tenant": tenant, "token": lease.token, "ticket": lease.ticket},
                )
                assert pool.release(lease), "lease lost while held"
        except BaseException as exc:
            report("error", f"sustain {tenant}: {exc!r}")

    def start(target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        threads.append(thread)
        thread.start()

    while True:
        command = inbox.get()
        if command[0] == "warm":
            # One request before the test's: the client's reader and
            # presence are set up before many threads start at once.
            pool.release(pool.acquire(timeout=120))
            report("warm", None)
        elif command[0] == "queue":
            _, tag, tenant, hold = command
            gates[tag] = threading.Event()
            start(one, tag, tenant, hold, None)
        elif command[0] == "queue_many":
            _, tag, tenant, count, hold = command
            gates[tag] = threading.Event()
            start(one, tag, tenant, hold, count)
        elif command[0] == "release":
            gates[command[1]].set()
        elif command[0] == "sustain":
            _, tenant, count = command
            for _ in range(count):
                start(sustain, tenant)
        elif command[0] == "stop":
            stop.set()
            for thread in threads:
                thread.join(120)
            report("stopped", None)
            return
