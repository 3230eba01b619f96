"""Throw-away replication setups for the replica and Sentinel tests.

``Replicated`` starts a primary and ``replicas`` replicas (``--replicaof``)
of the test server binary (tests/_servers.py), each a :class:`RedisServer`
on a free loopback port, and waits until every replica is in sync.
``Sentinels`` starts three Sentinels (``redis-server --sentinel``, which
every server of the matrix understands) that monitor the primary under the
name ``mymaster`` with a quorum of two, and can fail it over.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Any

import redis

from allocator._server import RedisServer

__all__ = ["MASTER", "Replicated", "Sentinels", "wait_for"]

MASTER = "mymaster"

#: Start a replica's sync at once (the default waits 5 s for more replicas).
NO_SYNC_DELAY = ["--repl-diskless-sync-delay", "0"]


def wait_for(what: str, check: Any, timeout: float = 30.0, every: float = 0.05) -> Any:
    """Poll ``check()`` until it returns something true; its value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except redis.RedisError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Replicated:
    """A primary and its replicas; use as a context manager."""

    def __init__(self, replicas: int = 1) -> None:
        # A replica's first sync starts at once, not after Redis's default
        # 5 s wait for more replicas (diskless sync): 5 s per test saved.
        self.primary = RedisServer(extra_args=NO_SYNC_DELAY)
        self.replicas: list[RedisServer] = []
        self._count = replicas

    @property
    def url(self) -> str:
        return self.primary.url

    def client(self, server: RedisServer | None = None, **kwargs: Any) -> redis.Redis:
        server = server or self.primary
        return redis.Redis(host="127.0.0.1", port=server.port, **kwargs)

    def start(self) -> Replicated:
        self.primary.start()
        for _ in range(self._count):
            replica = RedisServer(
                extra_args=[*NO_SYNC_DELAY, "--replicaof", "127.0.0.1", str(self.primary.port)]
            )
            self.replicas.append(replica.start())
        self.wait_synced()
        return self

    def wait_synced(self, count: int | None = None) -> None:
        """Until ``count`` (default: all) replicas are online at the primary."""
        want = len(self.replicas) if count is None else count
        with self.client() as admin:

            def online() -> bool:
                info = admin.info("replication")
                states = [
                    v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                ]
                return sum(1 for s in states if s.get("state") == "online") >= want

            wait_for(f"{want} replicas online", online)

    def stop_replica(self, index: int = 0) -> None:
        """Stop a replica (SIGTERM) and wait until the primary sees it gone."""
        self.replicas[index].stop()
        with self.client() as admin:
            wait_for(
                "the primary to lose the replica",
                lambda: admin.info("replication")["connected_slaves"] < len(self.replicas),
            )

    def start_replica(self, index: int = 0) -> None:
        self.replicas[index].start()
        self.wait_synced()

    def close(self) -> None:
        for server in [*self.replicas, self.primary]:
            server.close()

    def __enter__(self) -> Replicated:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Sentinels:
    """Three Sentinels that monitor ``replicated``'s primary; a context
    manager. ``down_after`` and ``failover_timeout`` in ms are kept short so
    that a failover takes about a second."""

    def __init__(
        self, replicated: Replicated, *, down_after: int = 1000, failover_timeout: int = 3000
    ) -> None:
        self.replicated = replicated
        self.servers: list[RedisServer] = []
        self.down_after = down_after
        self.failover_timeout = failover_timeout

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.servers]

    def start(self) -> Sentinels:
        port = self.replicated.primary.port
        for _ in range(3):
            server = RedisServer()
            conf = os.path.join(server.dir, "sentinel.conf")
            with open(conf, "w", encoding="utf-8") as f:
                f.write(
                    f"port {server.port}\n"
                    "bind 127.0.0.1\n"
                    f"dir {server.dir}\n"
                    f"logfile {os.path.join(server.dir, 'redis.log')}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER} {self.down_after}\n"
                    f"sentinel failover-timeout {MASTER} {self.failover_timeout}\n"
                    f"sentinel parallel-syncs {MASTER} 1\n"
                )
            # A Sentinel is the server binary with a config file and --sentinel.
            server._argv = lambda conf=conf, exe=server.executable: [  # type: ignore[method-assign]
                exe,
                conf,
                "--sentinel",
            ]
            self.servers.append(server.start())
        # Until every Sentinel knows the replicas and the other Sentinels.
        replicas = len(self.replicated.replicas)
        for server in self.servers:
            with redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True) as s:
                wait_for(
                    "the Sentinels to know each other and the replicas",
                    lambda s=s: (
                        (m := s.execute_command("SENTINEL", "MASTER", MASTER))
                        and int(_field(m, "num-other-sentinels")) >= 2
                        and int(_field(m, "num-slaves")) >= replicas
                    ),
                )
        return self

    def master_address(self) -> tuple[str, int]:
        with redis.Redis(host="127.0.0.1", port=self.servers[0].port, decode_responses=True) as s:
            host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
            return host, int(port)

    def failover(self, timeout: float = 30.0) -> tuple[str, int]:
        """Fail the primary over to a replica (``SENTINEL FAILOVER``) and
        wait until the new master takes writes; its address."""
        before = self.master_address()
        with redis.Redis(host="127.0.0.1", port=self.servers[0].port, decode_responses=True) as s:
            wait_for(
                "SENTINEL FAILOVER to be accepted",
                lambda: s.execute_command("SENTINEL", "FAILOVER", MASTER),
                timeout=timeout,
                every=0.2,
            )
        after = wait_for(
            "a new master",
            lambda: (addr := self.master_address()) != before and addr,
            timeout=timeout,
        )

        def writable() -> bool:
            with redis.Redis(host=after[0], port=after[1]) as c:
                role = c.execute_command("ROLE")
                return bool(role and role[0] in (b"master", "master"))

        wait_for("the new master to take writes", writable, timeout=timeout)
        return after  # type: ignore[no-any-return]

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> Sentinels:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _field(reply: Any, name: str) -> Any:
    """A field of a SENTINEL MASTER reply (a flat list on RESP2, a dict on RESP3)."""
    if isinstance(reply, dict):
        return reply.get(name, 0)
    items = list(reply)
    for i in range(0, len(items) - 1, 2):
        if items[i] == name:
            return items[i + 1]
    return 0


# -- a worker process on a Sentinel-managed client ------------------------------


def sentinel_worker(
    sentinels: list[tuple[str, int]],
    name: str,
    ledger_path: str,
    seed: int,
    stop: Any,
    ttl: float,
    hold: float,
    min_replicas: int,
) -> None:
    """Lease, hold, release on a ``Sentinel(...).master_for(...)`` client
    until ``stop.value`` is set, through failovers.

    The ledger (an fsync'ed JSON-lines file of this worker's own) gets a
    ``begin`` record for every lease ``acquire`` returned (so confirmed by
    ``min_replicas``), with the server time read after it; ``renew`` for
    every confirmed renewal (the new deadline); ``end`` before the release;
    and ``error`` records for what failed (NotReplicated, transport errors
    that outlived a call's retries) -- the loop goes on after them.
    """
    import json
    import random

    from redis.sentinel import Sentinel

    from allocator import AcquireTimeout, FairAllocator, LeaseLost, NotReplicated

    sentinel = Sentinel(sentinels, socket_timeout=2.0)
    client = sentinel.master_for(MASTER, socket_timeout=5.0)
    pool = FairAllocator(
        client, name, lease_ttl=ttl, min_replicas=min_replicas, replica_timeout=1.0
    )
    rng = random.Random(seed)
    transport = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)

    def now() -> float:
        while True:
            try:
                seconds, micros = client.time()
                return int(seconds) + int(micros) / 1e6
            except transport:
                time.sleep(0.05)

    with open(ledger_path, "a", encoding="utf-8") as ledger:

        def write(record: dict[str, Any]) -> None:
            ledger.write(json.dumps(record) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())

        while not stop.value:
            try:
                lease = pool.acquire(timeout=2.0)
            except AcquireTimeout:
                continue
            except (NotReplicated, *transport) as exc:
                write({"kind": "error", "op": "acquire", "error": type(exc).__name__})
                time.sleep(0.05)
                continue
            write({
                "kind": "begin", "pid": os.getpid(), "resource": lease.resource,
                "token": lease.token, "expires_at": lease.expires_at, "start": now(),
            })  # fmt: skip
            time.sleep(rng.uniform(0, hold))
            if rng.random() < 0.3:
                try:
                    lease = pool.renew(lease)
                except (LeaseLost, NotReplicated, *transport) as exc:
                    write({"kind": "error", "op": "renew", "error": type(exc).__name__})
                else:
                    write({
                        "kind": "renew", "token": lease.token, "resource": lease.resource,
                        "expires_at": lease.expires_at,
                    })  # fmt: skip
                time.sleep(rng.uniform(0, hold))
            write({
                "kind": "end", "token": lease.token, "resource": lease.resource, "end": now(),
            })  # fmt: skip
            try:
                released = pool.release(lease)
            except transport as exc:
                write({"kind": "error", "op": "release", "error": type(exc).__name__})
                continue
            write({"kind": "release", "token": lease.token, "released": released})
