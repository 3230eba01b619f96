"""``allocator bench``: latency and memory with a long queue, and many
asyncio waiters in one process."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING

from allocator._core.presence import HEARTBEAT_PRESENT
from allocator.cli.bench.base import (
    LONG_TTL,
    BenchBase,
    BenchError,
    ConnectionSampler,
    Probes,
    _extra_commands,
    _p,
    _stop,
)
from allocator.cli.bench.stats import (
    Row,
    Target,
    fifo_violations,
    format_value,
    grant_order_mismatches,
)
from allocator.cli.bench.workers import (
    WaitersSpec,
    waiters_helper,
)

if TYPE_CHECKING:
    import redis

    from allocator import FairAllocator, Lease

__all__ = ["Waiters", "commands_per_second"]


def commands_per_second(node: redis.Redis, name: str, seconds: float) -> float:
    """The commands a second that the connections named ``name`` send, over
    about ``seconds`` (``MONITOR`` on ``node``; the connections found with
    ``CLIENT LIST`` afterwards): what waiting costs a process. Its commands
    come in bursts a heartbeat apart, so the rate is the commands after the
    first over the time from the first to the last, not a window's count
    (which a burst at either edge would skew by one)."""
    seen: list[tuple[str, float]] = []
    with node.monitor() as monitor:  # type: ignore[no-untyped-call]
        end = time.monotonic() + seconds
        for event in monitor.listen():
            seen.append((f"{event['client_address']}:{event['client_port']}", event["time"]))
            if time.monotonic() > end:
                break
    mine = {c["addr"] for c in node.client_list() if c.get("name") == name}
    times = [t for addr, t in seen if addr in mine]
    if len(times) < 2:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


class Waiters(BenchBase):
    """Latency and memory with a long queue, and many asyncio waiters in one process."""

    def waiters(self) -> None:
        plan = self.plan
        n = plan.waiters
        self.progress.begin(f"{n:,} waiting asyncio tasks")
        queued_name = self.fresh("waiters")
        pools = {
            "queued": self.pool(queued_name, lease_ttl=LONG_TTL),
            "empty": self.pool(self.fresh("nowaiters"), lease_ttl=LONG_TTL),
        }
        held: dict[str, Lease | None] = {}
        for tag, pool in pools.items():
            pool.extend(["r0"])
            held[tag] = pool.acquire(timeout=10)
        name = f"{self.prefix}-waiters"
        spec = WaitersSpec(
            url=self.url,
            pool=queued_name,
            prefix=self.prefix,
            client_name=name,
            max_connections=plan.helper_connections,
            wait_timeout=max(600.0, n * 0.05),
            lease_ttl=60.0,
            cluster=self.cluster,
        )
        parent, child = self.ctx.Pipe()
        helper = self.ctx.Process(  # type: ignore[attr-defined]
            target=waiters_helper, args=(spec, child), daemon=True
        )
        conns = ConnectionSampler(self.node, name)
        try:
            helper.start()
            child.close()
            self._expect(parent, "ready", 120.0)
            # Two stages: the first opens the helper's connections (and whatever
            # the library sets up per process), so the memory delta of the
            # second is the tickets' own.
            first = max(1, n // 10)
            parent.send(("enqueue", first))
            stage1 = self._expect(parent, "enqueued", 180.0)
            mem0 = self.used_memory()
            parent.send(("enqueue", n - first))
            self.progress.update(f"enqueueing {n:,}")
            stage2 = self._expect(parent, "enqueued", 180.0)
            mem1 = self.used_memory()
            if stage2["waiting"] != n:
                self.problems.append(
                    f"after enqueueing {n:,} tasks the pool says {stage2['waiting']} waiting"
                )
            for _ in range(3):
                conns.sample()
                time.sleep(0.05)
            self.progress.update("counting what waiting costs")
            idle_per_s = commands_per_second(self.node, name, 3 * HEARTBEAT_PRESENT)
            probes = self._probe_queue(pools, held, conns)

            # Let them all through: each task releases as soon as it is served.
            parent.send(("finish", max(120.0, n * 0.05)))
            t_release = time.monotonic_ns()
            lease, held["queued"] = held["queued"], None
            assert lease is not None
            pools["queued"].release(lease)
            deadline = time.monotonic() + max(120.0, n * 0.05) + 60.0
            while not parent.poll(0.1):
                if time.monotonic() > deadline:
                    raise BenchError("the waiters helper did not finish")
                conns.sample()
                self.progress.update("serving")
            done = self._recv(parent, "done")
        finally:
            for tag, current in held.items():
                if current is not None:
                    pools[tag].release(current)
            if helper.is_alive():
                with contextlib.suppress(OSError):
                    parent.send(("quit", None))
            _stop([helper], grace=30.0)
            parent.close()

        per_ticket = (mem1 - mem0) / (n - first)
        grants = [tuple(g) for g in done["grants"]]
        served = len(grants)
        violations = fifo_violations((g[1], g[2]) for g in grants)
        mismatches = grant_order_mismatches((g[3], g[1], g[2]) for g in grants)
        self.task_fifo = (violations, served)
        serve_s = (max((g[4] for g in grants), default=t_release) - t_release) / 1e9
        if done["errors"]:
            self.problems.append(
                f"{len(done['errors'])} asyncio tasks failed, first: {done['errors'][0]}"
            )
        if mismatches:
            self.problems.append(
                f"asyncio tasks: token order and (granted_at, ticket) order disagree on "
                f"{mismatches} pairs"
            )
        self.details["waiters"] = {
            "tasks": n,
            "stage1": {k: v for k, v in stage1.items() if k != "errors"},
            "stage2": {k: v for k, v in stage2.items() if k != "errors"},
            "used_memory_delta": mem1 - mem0,
            "bytes_per_ticket": per_ticket,
            **probes.details(),
            "served": served,
            "unfinished": done["unfinished"],
            "fifo_violations": violations,
            "token_order_mismatches": mismatches,
            "serve_all_s": serve_s,
            "idle_commands_per_s": idle_per_s,
            "errors": done["errors"][:20],
            **conns.details(),
        }
        op = f"acquire(timeout={probes.timeout:g})"
        self.add(
            Row(
                "5c",
                f"{op} p50, {n:,} waiting",
                _p(probes.acquire["queued"], "p50"),
                "ns",
                _p(probes.acquire["empty"], "p50"),
                "no waiters",
                Target("<=", 1.3),
                note="enqueues behind the waiters and leaves (the resource is held)",
            )
        )
        self.add(
            Row(
                "5d",
                f"renew p50, {n:,} waiting",
                _p(probes.renew["queued"], "p50"),
                "ns",
                _p(probes.renew["empty"], "p50"),
                "no waiters",
                Target("<=", 1.3),
                note=_extra_commands(probes.renew_cmds["queued"], probes.renew_cmds["empty"]),
            )
        )
        self.add(
            Row(
                "6b",
                "Redis memory per waiting ticket",
                per_ticket,
                "B",
                target=Target("<=", 300, on="value", unit="B"),
                note=f"used_memory delta over the last {n - first:,} of {n:,} waiters",
            )
        )
        self.add(
            Row(
                "7a",
                f"{n:,} asyncio tasks served, in order",
                float(n - served + violations),
                "",
                target=Target("<=", 0, on="value"),
                text=f"{served:,}/{n:,}, {violations} out of order",
                note=f"all served {serve_s:.2f} s after the lease was released "
                f"({served / max(serve_s, 1e-9):,.0f} grants/s)",
            )
        )
        self.add(
            Row(
                "7b",
                "connections used for waiting (max)",
                float(conns.max_waiting),
                "",
                target=Target("<=", 2, on="value"),
                note=f"blocked or subscribed connections of the helper process, from "
                f"{conns.samples} CLIENT LIST samples "
                f"(commands: {', '.join(sorted(conns.commands)) or '-'}); "
                f"{conns.max_total} connections in all at most, client pool limit "
                f"{plan.helper_connections}",
            )
        )
        self.add(
            Row(
                "7c",
                "commands a second from the waiting process",
                idle_per_s,
                "",
                target=Target("<=", 1.05, on="value"),
                text=f"{idle_per_s:.2f}/s",
                note=f"{n:,} tasks waiting in one process, over "
                f"{3 * HEARTBEAT_PRESENT:g} s (MONITOR): its heartbeats and blocking reads, "
                f"two every {HEARTBEAT_PRESENT:g} s",
            )
        )
        self.progress.end(
            f"{served:,}/{n:,} served in {serve_s:.1f} s, {violations} out of order, "
            f"{format_value(per_ticket, 'B')}/ticket"
        )

    def _probe_queue(
        self,
        pools: dict[str, FairAllocator],
        held: dict[str, Lease | None],
        conns: ConnectionSampler,
    ) -> Probes:
        """Time ``acquire(timeout=0)`` and ``renew`` on the pool with waiters
        (``"queued"``) and the one without (``"empty"``), sample by sample in
        alternating order; the resource of each is held, so every acquire
        enqueues and leaves."""
        from allocator import AcquireTimeout

        plan = self.plan
        probes = Probes()
        granted = 0
        now = time.monotonic_ns
        warmup = min(100, plan.op_samples // 10)
        for i in range(warmup + plan.op_samples):
            order = ("empty", "queued") if i % 2 == 0 else ("queued", "empty")
            for tag in order:
                t0 = now()
                try:
                    lease = pools[tag].acquire(timeout=probes.timeout)
                except AcquireTimeout:
                    lease = None
                except ValueError as exc:
                    if probes.timeout > 0:
                        raise
                    self.problems.append(
                        f"acquire(timeout=0) raised {exc!r}; probing with timeout=0.001"
                    )
                    probes.timeout = 0.001
                    continue
                t1 = now()
                if lease is not None:
                    granted += 1
                    pools[tag].release(lease)
                elif i >= warmup:
                    probes.acquire[tag].append(t1 - t0)
            for tag in order:
                t0 = now()
                self._renew(pools, held, tag)
                t1 = now()
                if i >= warmup:
                    probes.renew[tag].append(t1 - t0)
            if i % 100 == 0:
                self.progress.update(f"probes {i}/{warmup + plan.op_samples}")
            if i % 500 == 0:
                conns.sample()
        if granted:
            self.problems.append(
                f"acquire(timeout={probes.timeout:g}) was granted {granted} times "
                "while the only resource was held"
            )
        # What the server runs per renew, with and without a queue behind.
        for tag in ("queued", "empty"):
            probes.renew_cmds[tag] = self._commands_per_call(
                functools.partial(self._renew, pools, held, tag), 200
            )
        return probes
