"""What every scenario of ``allocator bench`` shares: the run's state and
plumbing (:class:`BenchBase`), the results of a contended run, and small
helpers. Each scenario is a class of its own module, built on this one;
:class:`allocator.cli.bench.scenarios.Bench` puts them together."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import attrs
import redis
from redis.crc import key_slot

from allocator.cli._common import is_cluster
from allocator.cli.bench.stats import (
    ArrivalOrder,
    GrantSample,
    Row,
    exclusivity_violations,
    fifo_violations,
    grant_order_mismatches,
    grants_per_worker,
    handoffs,
    jain_index,
    out_of_arrival_order,
    summarize,
    throughput,
)
from allocator.cli.bench.workers import (
    LIBRARY,
    SOCKET_TIMEOUT,
    sync_client,
)

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    from allocator import FairAllocator, Lease
    from allocator.cli.bench import Plan, Progress

__all__ = [
    "ORDER_SLACK_NS",
    "ORDER_TIGHT_NS",
    "BenchBase",
    "BenchError",
    "ConnectionSampler",
    "Probes",
    "RunResult",
]


# A waiting task and a held lease must outlive every scenario.
LONG_TTL = 3600.0

#: A grant counts as seen out of arrival order (figure 3c) when a client that
#: started its acquire later saw its grant more than this much earlier.
ORDER_SLACK_NS = 5_000_000
#: The same, more strictly (figure 3d): on a machine with a core per
#: process, scheduling rarely costs a grant a millisecond.
ORDER_TIGHT_NS = 1_000_000


class BenchError(Exception):
    """A scenario could not be run (a worker failed, a reply was wrong)."""


@attrs.frozen
class RunResult:
    """The grants of one contended run and what the server spent on them."""

    kind: str
    procs: int
    resources: int
    samples: list[GrantSample]
    window: tuple[int, int]
    errors: list[str]
    cpu_s: float
    commands: dict[str, tuple[int, int]] = attrs.field(factory=dict)

    @property
    def rate(self) -> float:
        return throughput(self.samples, *self.window)

    @property
    def jain(self) -> float:
        return jain_index(grants_per_worker(self.samples, self.procs, *self.window))

    @property
    def cpu_ns_per_grant(self) -> float | None:
        return self.cpu_s * 1e9 / len(self.samples) if self.samples else None

    def fifo(self) -> int:
        return fifo_violations((s.ticket, s.granted_at) for s in self.samples)

    def arrival_order(self, more_than_ns: int = ORDER_SLACK_NS) -> ArrivalOrder:
        """Grants of this run's window seen out of arrival order by more
        than ``more_than_ns``, as the workers' clocks saw them."""
        return out_of_arrival_order(
            ((s.t_wait, s.t_acquired) for s in self.samples), more_than_ns, *self.window
        )

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "processes": self.procs,
            "resources": self.resources,
            "grants": len(self.samples),
            "window_s": (self.window[1] - self.window[0]) / 1e9,
            "grants_per_s": self.rate,
            "jain_index": self.jain,
            "grants_per_process": grants_per_worker(self.samples, self.procs, *self.window),
            "redis_cpu_s": self.cpu_s,
            "redis_cpu_ns_per_grant": self.cpu_ns_per_grant,
            "hold_ns": _summary_dict(s.t_release - s.t_acquired for s in self.samples),
            "errors": self.errors[:20],
            "error_count": len(self.errors),
            "overlapping_holds": exclusivity_violations(self.samples),
            "seen_out_of_arrival_order": _arrival_order_dict(self.arrival_order()),
            "seen_out_of_arrival_order_tight": _arrival_order_dict(
                self.arrival_order(ORDER_TIGHT_NS), ORDER_TIGHT_NS
            ),
            "redis_commands_per_grant": _per_grant(self.commands, len(self.samples)),
        }
        if self.resources == 1:
            gaps = handoffs(self.samples, *self.window)
            out["handoff_from_release_call_ns"] = _summary_dict(gaps.from_call)
            out["handoff_from_release_return_ns"] = _summary_dict(gaps.from_return)
        if self.kind == LIBRARY:
            out["fifo_violations"] = self.fifo()
            if self.resources == 1:
                out["token_order_mismatches"] = grant_order_mismatches(
                    (s.token, s.ticket, s.granted_at) for s in self.samples
                )
        return out


def _arrival_order_dict(found: ArrivalOrder, more_than_ns: int = ORDER_SLACK_NS) -> dict[str, int]:
    return {
        "more_than_ns": more_than_ns,
        "grants": found.grants,
        "late": found.late,
        "worst_ns": found.worst_ns,
    }


def _summary_dict(values: Iterable[float]) -> dict[str, Any] | None:
    summary = summarize(list(values))
    return None if summary is None else summary.as_dict()


def _p(values: Sequence[float], which: str) -> float | None:
    summary = summarize(values)
    return None if summary is None else float(getattr(summary, which))


@attrs.define
class Probes:
    """Per-op latencies (ns) on the pool with waiters and the one without."""

    timeout: float = 0.0
    acquire: dict[str, list[int]] = attrs.field(factory=lambda: {"queued": [], "empty": []})
    renew: dict[str, list[int]] = attrs.field(factory=lambda: {"queued": [], "empty": []})
    renew_cmds: dict[str, dict[str, float]] = attrs.field(factory=dict)

    def details(self) -> dict[str, Any]:
        return {
            "probe_timeout": self.timeout,
            "acquire_probe_ns": {tag: _summary_dict(v) for tag, v in self.acquire.items()},
            "renew_ns": {tag: _summary_dict(v) for tag, v in self.renew.items()},
            "redis_commands_per_renew": self.renew_cmds,
        }


class ConnectionSampler:
    """Counts, from CLIENT LIST, the connections named ``name`` and those of
    them that wait (blocked on a command, or subscribed); keeps the maxima."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.samples = 0
        self.max_waiting = 0
        self.max_total = 0
        self.commands: set[str] = set()

    def sample(self) -> None:
        mine = [c for c in self.client.client_list() if c.get("name") == self.name]
        waiting = [c for c in mine if _is_waiting(c)]
        self.samples += 1
        self.max_waiting = max(self.max_waiting, len(waiting))
        self.max_total = max(self.max_total, len(mine))
        self.commands.update(c.get("cmd", "") for c in waiting)

    def details(self) -> dict[str, Any]:
        return {
            "waiting_connections_max": self.max_waiting,
            "helper_connections_max": self.max_total,
            "waiting_commands": sorted(self.commands),
            "connection_samples": self.samples,
        }


class BenchBase:
    """One benchmark run against one server: its state, and the plumbing
    every scenario uses."""

    def __init__(
        self,
        *,
        plan: Plan,
        url: str,
        private: bool,
        ctx: BaseContext,
        progress: Progress,
    ) -> None:
        self.plan = plan
        self.url = url
        self.private = private
        self.ctx = ctx
        self.progress = progress
        self.prefix = f"allocbench-{uuid.uuid4().hex[:8]}"
        options: dict[str, Any] = {
            "socket_timeout": SOCKET_TIMEOUT,
            "client_name": f"{self.prefix}-main",
        }
        #: The server ``url`` names: the baselines (PING, EVALSHA) and the
        #: figures (INFO, CLIENT LIST) are read there.
        self.node = redis.Redis.from_url(url, **options)
        self.cluster = is_cluster(self.node)
        #: The library's client: on a Redis Cluster a cluster client, as the
        #: other commands use, with every pool and list of the run placed in
        #: the slots of ``node`` (:meth:`fresh`), so that its figures are theirs.
        self.client: Any = sync_client(url, True, **options) if self.cluster else self.node
        self._slots = _own_slots(self.node) if self.cluster else None
        self.redis_version = str(self.node.info("server").get("redis_version", "?"))
        self.rows: list[Row] = []
        self.details: dict[str, Any] = {}
        self.problems: list[str] = []
        self.failed_scenarios: list[str] = []
        self.library_runs: list[RunResult] = []
        self.token_runs: list[RunResult] = []
        self.task_fifo: tuple[int, int] | None = None  # (violations, grants)
        self._names = 0

    def fresh(self, what: str) -> str:
        """A new name for a pool (or, as ``{name}``, the hash tag of a key);
        on a cluster, one whose slot is served by the node of ``--url``."""
        while True:
            self._names += 1
            name = f"bench-{what}-{self._names}"
            if self._slots is None or key_slot(f"{{{name}}}".encode()) in self._slots:
                return name

    def pool(self, name: str, lease_ttl: float = 60.0) -> FairAllocator:
        from allocator import FairAllocator

        return FairAllocator(self.client, name, lease_ttl=lease_ttl, prefix=self.prefix)

    def used_memory(self) -> int:
        self.node.ping()  # let the server settle this connection's buffers
        return int(self.node.info("memory")["used_memory"])

    def command_stats(self) -> dict[str, tuple[int, int]]:
        """INFO commandstats as command -> (calls, usec). Commands run by
        scripts are counted too, and their time is inside the script's."""
        info = self.node.info("commandstats")
        return {
            key[len("cmdstat_") :]: (int(v["calls"]), int(v["usec"]))
            for key, v in info.items()
            if key.startswith("cmdstat_")
        }

    def cpu_seconds(self) -> float:
        info = self.node.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.rows.sort(key=lambda r: r.key)

    def close(self) -> None:
        if not self.private:
            self._delete_keys()
        self.client.close()
        self.node.close()

    def _delete_keys(self) -> None:
        # On a server we do not own, leave nothing behind. Pool keys start with
        # the pool's prefix; token lists were put under it too. On a cluster
        # they are all on the node of --url, in slots of their own: one key
        # per UNLINK there.
        try:
            batch: list[Any] = []
            for key in self.node.scan_iter(match=f"{self.prefix}*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self._unlink(batch)
                    batch = []
            if batch:
                self._unlink(batch)
        except redis.RedisError as exc:
            self.problems.append(f"could not delete the benchmark's keys ({self.prefix}*): {exc}")

    def _unlink(self, keys: list[Any]) -> None:
        if not self.cluster:
            self.node.unlink(*keys)
            return
        pipe = self.node.pipeline(transaction=False)
        for key in keys:
            pipe.unlink(key)
        pipe.execute()

    @staticmethod
    def _renew(pools: dict[str, FairAllocator], held: dict[str, Lease | None], tag: str) -> None:
        current = held[tag]
        assert current is not None
        held[tag] = pools[tag].renew(current)

    def _commands_per_call(self, fn: Callable[[], object], n: int) -> dict[str, float]:
        """Commands the server ran per call of ``fn`` (scripts' inner ones included)."""
        before = self.command_stats()
        for _ in range(n):
            fn()
        after = self.command_stats()
        return {cmd: calls / n for cmd, (calls, _) in _diff(before, after).items() if cmd != "info"}

    def _expect(self, conn: Connection, tag: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not conn.poll(0.1):
            if time.monotonic() > deadline:
                raise BenchError(f"the waiters helper did not say {tag!r} within {timeout:.0f} s")
            self.progress.update(f"waiting for helper: {tag}")
        return self._recv(conn, tag)

    @staticmethod
    def _recv(conn: Connection, tag: str) -> Any:
        try:
            got, payload = conn.recv()
        except EOFError:
            raise BenchError(f"the waiters helper exited before {tag!r}") from None
        if got == "error":
            raise BenchError(f"the waiters helper failed:\n{payload}")
        if got != tag:
            raise BenchError(f"the waiters helper said {got!r}, expected {tag!r}")
        return payload


_BLOCKING_COMMANDS = frozenset(
    {
        "blpop", "brpop", "blmove", "brpoplpush", "blmpop", "bzpopmin", "bzpopmax",
        "bzmpop", "xread", "xreadgroup", "subscribe", "psubscribe", "ssubscribe",
    }
)  # fmt: skip


def _own_slots(node: Any) -> set[int]:
    """The hash slots a cluster node serves (CLUSTER SLOTS, by its id)."""
    me = node.execute_command("CLUSTER", "MYID")
    me = me.decode() if isinstance(me, bytes) else str(me)
    owned: set[int] = set()
    for start, end, master, *_replicas in node.execute_command("CLUSTER", "SLOTS"):
        ident = master[2].decode() if isinstance(master[2], bytes) else str(master[2])
        if ident == me:
            owned.update(range(int(start), int(end) + 1))
    if not owned:
        raise BenchError(
            "the node of --url serves no slot of the cluster (a replica?): name a master"
        )
    return owned


def _is_waiting(client: dict[str, str]) -> bool:
    """A connection parked on a blocking command or a subscription."""
    flags = client.get("flags", "")
    return "b" in flags or "P" in flags or client.get("cmd", "") in _BLOCKING_COMMANDS


def _stop(processes: Sequence[Any], grace: float) -> None:
    """Join ``processes`` within ``grace`` seconds in all, then terminate the rest."""
    deadline = time.monotonic() + grace
    for proc in processes:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join()


def _diff(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    out = {}
    for cmd, (calls, usec) in after.items():
        c0, u0 = before.get(cmd, (0, 0))
        if calls > c0:
            out[cmd] = (calls - c0, usec - u0)
    return out


def _per_grant(commands: dict[str, tuple[int, int]], grants: int) -> dict[str, Any]:
    """Calls per grant and server time per call, by command."""
    if not grants:
        return {}
    return {
        cmd: {"calls_per_grant": calls / grants, "usec_per_call": usec / calls}
        for cmd, (calls, usec) in sorted(commands.items())
    }


# What a client sends itself; the rest of commandstats is run inside scripts.
_CLIENT_COMMANDS = (
    "fcall", "fcall_ro", "evalsha", "eval", "blpop", "rpush", "lpush", "function|load",
    "script|load",
)  # fmt: skip
#: The calls that run the library's Lua (a Functions library, or scripts).
_SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "eval")


def _script_calls(commands: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Calls and server µs of the library's Lua, on either path."""
    pairs = [commands.get(cmd, (0, 0)) for cmd in _SCRIPT_COMMANDS]
    return sum(c for c, _ in pairs), sum(u for _, u in pairs)


def _commands_text(runs: Sequence[RunResult]) -> str:
    """``2.00 EVALSHA (95 µs each) + 1.00 BLPOP`` per grant, over ``runs``."""
    grants = sum(len(r.samples) for r in runs)
    if not grants:
        return "-"
    total: dict[str, list[int]] = {}
    for r in runs:
        for cmd, (calls, usec) in r.commands.items():
            acc = total.setdefault(cmd, [0, 0])
            acc[0] += calls
            acc[1] += usec
    parts = []
    for cmd in _CLIENT_COMMANDS:
        if cmd in total:
            calls, usec = total[cmd]
            text = f"{calls / grants:.2f} {cmd.upper()}"
            if cmd in _SCRIPT_COMMANDS:
                text += f" ({usec / calls:.0f} µs each)"
            parts.append(text)
    return " + ".join(parts) or "-"


def _extra_commands(with_: dict[str, float], without: dict[str, float], what: str = "renew") -> str:
    """The commands one call runs more often in the first case than the second."""
    extra = {
        cmd: n - without.get(cmd, 0.0)
        for cmd, n in with_.items()
        if n - without.get(cmd, 0.0) >= 0.05
    }
    if not extra:
        return f"each {what} runs the same commands on the server either way"
    listed = ", ".join(f"{cmd.upper()} +{n:.2f}" for cmd, n in sorted(extra.items()))
    return f"with waiters each {what} also runs: {listed}"


def _us(usec: float | None) -> str:
    return "-" if usec is None else f"{usec:.1f} µs"


def _cpu_per_grant(runs: Sequence[RunResult]) -> float | None:
    grants = sum(len(r.samples) for r in runs)
    return sum(r.cpu_s for r in runs) * 1e9 / grants if grants else None
