"""A throw-away local Redis Cluster for the cluster tests.

``LocalCluster`` starts ``masters`` ``redis-server`` processes (and, with
``replicas=N``, N replicas of each, which :meth:`LocalCluster.failover`
promotes with ``CLUSTER FAILOVER``) with ``--cluster-enabled yes``, each
on a free loopback port in its own temporary directory, splits the 16384 slots evenly between them
(``CLUSTER ADDSLOTSRANGE``), gives each a distinct config epoch, joins them
with ``CLUSTER MEET`` and waits until every node reports ``cluster_state:ok``
and the same slot map. Building the cluster by hand instead of with
``redis-cli --cluster create`` saves the second or two redis-cli spends
sleeping while the nodes join.

It also moves a slot from one master to another the way ``redis-cli
--cluster reshard`` does (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` of the
slot's keys, ``SETSLOT NODE`` on every node), in steps a test can interleave
with other events.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import redis

from allocator._server import RedisServer, free_port

__all__ = ["LocalCluster", "Node"]

SLOTS = 16384
#: A little more than the server's time limit on a manual failover
#: (CLUSTER_MF_TIMEOUT, 5 s), after which ``failover`` asks again.
MANUAL_FAILOVER_WINDOW = 6.0


class Node:
    """One master of the local cluster, with an admin client (bytes replies)."""

    def __init__(self, server: RedisServer, bus_port: int) -> None:
        self.server = server
        self.bus_port = bus_port
        self.host = "127.0.0.1"
        self.port = server.port
        self.client = redis.Redis(host=self.host, port=self.port, protocol=2)
        self.id = ""
        #: A replica's master (None for a master).
        self.master: Node | None = None

    @property
    def name(self) -> str:
        """``host:port``, as redis-py's cluster client names its nodes."""
        return f"{self.host}:{self.port}"

    def info(self, section: str) -> dict[str, Any]:
        return self.client.info(section)  # type: ignore[no-any-return]

    def cluster_info(self) -> dict[str, str]:
        raw = self.client.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def blocked_on(self, *commands: str) -> int:
        """Clients blocked in one of ``commands`` on this node right now
        (by default a reader's round: BLMPOP, or BLPOP on Redis 6.2)."""
        wanted = commands or ("blmpop", "blpop")
        return sum(
            1
            for c in self.client.client_list()
            if c.get("cmd") in wanted and "b" in c.get("flags", "")
        )

    def rejected_calls(self) -> int:
        """Commands this node refused before running them (MOVED, ASK,
        TRYAGAIN, CROSSSLOT, ...), over all commands (INFO commandstats)."""
        stats = self.info("commandstats")
        return sum(int(row.get("rejected_calls", 0)) for row in stats.values())

    def errorstats(self) -> dict[str, int]:
        """INFO errorstats as {error prefix: count}."""
        out = {}
        for field, value in self.info("errorstats").items():
            if field.startswith("errorstat_"):
                out[field.removeprefix("errorstat_")] = int(value["count"])
        return out

    def __repr__(self) -> str:
        return f"Node({self.name}, id={self.id[:8]})"


class LocalCluster:
    """``with LocalCluster() as cluster:`` a ready 3-master Redis Cluster."""

    def __init__(self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self.masters = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        #: The masters, in slot order (a failover swaps a replica in).
        self.nodes: list[Node] = []
        #: The replicas (``replicas`` per master), each with ``master`` set.
        self.replicas: list[Node] = []

    def _server(self) -> tuple[RedisServer, int]:
        bus_port = free_port()
        server = RedisServer(
            extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-require-full-coverage", "yes",
                # The bus port defaults to port + 10000, which may be
                # taken or past 65535: give it a free port of its own.
                "--cluster-port", str(bus_port),
                # A replica's first sync at once, not after a 5 s wait.
                "--repl-diskless-sync-delay", "0",
            ]
        )  # fmt: skip
        return server, bus_port

    # -- life cycle -----------------------------------------------------------

    def start(self, timeout: float = 20.0) -> LocalCluster:
        try:
            for _ in range(self.masters):
                server, bus_port = self._server()
                self.nodes.append(Node(server, bus_port))
                server.start()
            self._create(timeout)
            if self.replicas_per_master:
                self._add_replicas(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _create(self, timeout: float) -> None:
        per = SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            node.id = _text(node.client.execute_command("CLUSTER", "MYID"))
            first = i * per
            last = SLOTS - 1 if i == self.masters - 1 else first + per - 1
            node.client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            # Distinct epochs, as redis-cli gives them: no collision to resolve.
            node.client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            self.nodes[0].client.execute_command(
                "CLUSTER", "MEET", node.host, node.port, node.bus_port
            )
        self.wait_consistent(timeout)

    def _add_replicas(self, timeout: float) -> None:
        """Start the replicas, join them, make each replicate its master,
        and wait until every master has its replicas online."""
        for master in self.nodes:
            for _ in range(self.replicas_per_master):
                server, bus_port = self._server()
                node = Node(server, bus_port)
                node.master = master
                server.start()
                node.id = _text(node.client.execute_command("CLUSTER", "MYID"))
                self.replicas.append(node)
                self.nodes[0].client.execute_command(
                    "CLUSTER", "MEET", node.host, node.port, node.bus_port
                )
        deadline = time.monotonic() + timeout
        for node in self.replicas:
            while True:
                try:
                    node.client.execute_command("CLUSTER", "REPLICATE", node.master.id)
                    break
                except redis.ResponseError:  # does not know the master yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.wait_replicas(timeout)
        self.wait_consistent(timeout)

    def wait_replicas(self, timeout: float = 20.0) -> None:
        """Until every master has ``replicas`` replicas online."""
        deadline = time.monotonic() + timeout
        for master in self.nodes:
            while True:
                info = master.info("replication")
                online = sum(
                    1
                    for key, value in info.items()
                    if key.startswith("slave")
                    and isinstance(value, dict)
                    and value.get("state") == "online"
                )
                if online >= self.replicas_per_master:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{master}: {online} replicas online after {timeout}s")
                time.sleep(0.05)

    def failover(self, replica: Node, timeout: float = 30.0) -> Node:
        """``CLUSTER FAILOVER`` on ``replica``: it takes over its master's
        slots, the old master becomes its replica. Waits until every node
        agrees and the new master's replica is online; returns the old
        master."""
        old = replica.master
        assert old is not None
        deadline = time.monotonic() + timeout
        asked = 0.0
        while _text(replica.client.execute_command("ROLE")[0]) != "master":
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{replica} did not become a master within {timeout}s")
            if now >= asked + MANUAL_FAILOVER_WINDOW:
                # A manual failover that does not complete within the
                # server's own 5 s is given up by the server ("Manual
                # failover timed out"), now and then on a loaded machine,
                # with or without allocator clients: ask again.
                replica.client.execute_command("CLUSTER", "FAILOVER")
                asked = now
            time.sleep(0.05)
        self.nodes[self.nodes.index(old)] = replica
        self.replicas[self.replicas.index(replica)] = old
        replica.master, old.master = None, replica
        for node in self.replicas:
            if node.master is old:
                node.master = replica
        self.wait_consistent(timeout)
        self.wait_replicas(timeout)
        return old

    def wait_consistent(self, timeout: float = 20.0) -> None:
        """Until every node is ``cluster_state:ok``, knows every other node,
        and has the same slot map."""
        deadline = time.monotonic() + timeout
        while True:
            problem = self._inconsistency()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"local cluster not ready after {timeout}s: {problem}")
            time.sleep(0.02)

    def _inconsistency(self) -> str | None:
        maps = []
        everyone = self.nodes + self.replicas
        for node in everyone:
            info = node.cluster_info()
            if info.get("cluster_state") != "ok":
                return f"{node} state {info.get('cluster_state')}"
            if int(info.get("cluster_known_nodes", 0)) != len(everyone):
                return f"{node} knows {info.get('cluster_known_nodes')} nodes"
            maps.append(self._slot_map(node))
        if any(m != maps[0] for m in maps[1:]):
            return "nodes disagree on the slot map"
        return None

    @staticmethod
    def _slot_map(node: Node) -> list[tuple[int, int, int]]:
        """(first, last, port) for each slot range, as ``node`` sees it."""
        rows = node.client.execute_command("CLUSTER", "SLOTS")
        out = []
        for row in rows:
            if isinstance(row, dict):  # defensive: a parsed reply
                continue
            out.append((int(row[0]), int(row[1]), int(row[2][1])))
        return sorted(out)

    def close(self) -> None:
        for node in self.nodes + self.replicas:
            with contextlib.suppress(Exception):
                node.client.close()
            node.server.close()
        self.nodes = []
        self.replicas = []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- topology -------------------------------------------------------------

    @property
    def startup(self) -> tuple[str, int]:
        return self.nodes[0].host, self.nodes[0].port

    def owner(self, slot: int) -> Node:
        """The master that serves ``slot`` (by the first node's map)."""
        for first, last, port in self._slot_map(self.nodes[0]):
            if first <= slot <= last:
                return self.node_at(port)
        raise LookupError(f"slot {slot} is not served")

    def node_at(self, port: int) -> Node:
        for node in self.nodes + self.replicas:
            if node.port == port:
                return node
        raise LookupError(f"no node on port {port}")

    def keyslot(self, key: str | bytes) -> int:
        """CLUSTER KEYSLOT, as the server computes it."""
        return int(self.nodes[0].client.execute_command("CLUSTER", "KEYSLOT", key))

    # -- resharding -----------------------------------------------------------

    def begin_migration(self, slot: int, target: Node) -> Migration:
        """Open the migration of ``slot`` to ``target``: IMPORTING on the
        target, then MIGRATING on the source (redis-cli's order)."""
        source = self.owner(slot)
        if source is target:
            raise ValueError(f"slot {slot} is already on {target}")
        target.client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.id)
        source.client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.id)
        return Migration(self, slot, source, target)

    def migrate_slot(self, slot: int, target: Node) -> None:
        """Move ``slot`` with all its keys to ``target``, start to end."""
        migration = self.begin_migration(slot, target)
        migration.move_keys()
        migration.finish()

    @contextlib.contextmanager
    def migrating(self, slot: int, target: Node) -> Iterator[Migration]:
        """The body runs while the slot is open (MIGRATING/IMPORTING) with
        its keys still on the source; the keys move and the slot is handed
        over when it ends."""
        migration = self.begin_migration(slot, target)
        try:
            yield migration
        finally:
            migration.move_keys()
            migration.finish()


class Migration:
    """A slot on its way from ``source`` to ``target``."""

    def __init__(self, cluster: LocalCluster, slot: int, source: Node, target: Node) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target
        self.moved = 0

    def move_keys(self, batch: int = 100) -> int:
        """MIGRATE every key of the slot from the source to the target."""
        while True:
            keys = self.source.client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
            if not keys:
                return self.moved
            self.source.client.execute_command(
                "MIGRATE", self.target.host, self.target.port, "", 0, 5000, "KEYS", *keys
            )
            self.moved += len(keys)

    def finish(self) -> None:
        """SETSLOT NODE on the target first (it bumps its epoch), then the
        source, then every other master; then wait for agreement."""
        order = [self.target, self.source] + [
            n for n in self.cluster.nodes if n is not self.target and n is not self.source
        ]
        for node in order:
            node.client.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target.id)
        self.cluster.wait_consistent()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
