"""``allocator bench``: the uncontended acquire+release cycle, next to PING."""

from __future__ import annotations

import time

from allocator.cli.bench.base import (
    BenchBase,
    _diff,
    _p,
    _per_grant,
    _script_calls,
    _summary_dict,
    _us,
)
from allocator.cli.bench.floor import Floor
from allocator.cli.bench.stats import (
    Row,
    Target,
    format_value,
)

__all__ = ["Uncontended"]


class Uncontended(BenchBase):
    """The uncontended acquire+release cycle, next to PING."""

    def uncontended(self) -> None:
        plan = self.plan
        self.progress.begin("uncontended acquire+release vs PING")
        pool = self.pool(self.fresh("uncontended"))
        pool.extend(["r0"])
        script = self.node.register_script("return 1")
        ping: list[int] = []
        evalsha: list[int] = []
        acquire: list[int] = []
        release: list[int] = []
        cycle: list[int] = []
        now = time.monotonic_ns
        warmup = min(200, plan.uncontended_samples // 10)
        for i in range(warmup + plan.uncontended_samples):
            # Interleaved sample by sample: whatever the machine does to one
            # series, it does to the others too.
            t0 = now()
            self.node.ping()
            t1 = now()
            script()
            t2 = now()
            lease = pool.acquire(timeout=10)
            t3 = now()
            pool.release(lease)
            t4 = now()
            if i >= warmup:
                ping.append(t1 - t0)
                evalsha.append(t2 - t1)
                acquire.append(t3 - t2)
                release.append(t4 - t3)
                cycle.append(t4 - t2)
            if i % 100 == 0:
                self.progress.update(f"{i}/{warmup + plan.uncontended_samples}")
        # Server time per script call, from INFO commandstats: what the Lua
        # itself costs, apart from the round trip.
        extra = max(1, min(500, plan.uncontended_samples // 4))
        stats0 = self.command_stats()
        for _ in range(extra):
            pool.release(pool.acquire(timeout=10))
        stats1 = self.command_stats()
        for _ in range(extra):
            script()
        stats2 = self.command_stats()
        # The same with the pool's event log on: what it costs a grant
        # (and its release), on the server (docs/operations.md, event log).
        pool.set_events(100_000)
        stats3 = self.command_stats()
        for _ in range(extra):
            pool.release(pool.acquire(timeout=10))
        stats4 = self.command_stats()
        pool.set_events(None)
        lib_calls, lib_usec = _script_calls(_diff(stats0, stats1))
        ev_calls, ev_usec = _script_calls(_diff(stats3, stats4))
        one_calls, one_usec = _diff(stats1, stats2).get("evalsha", (0, 0))
        lib_script_us = lib_usec / lib_calls if lib_calls else None
        one_script_us = one_usec / one_calls if one_calls else None
        self.details["uncontended"] = {
            "server_usec_per_library_call": lib_script_us,
            "server_usec_per_library_call_events_on": ev_usec / ev_calls if ev_calls else None,
            "library_calls_per_cycle": lib_calls / extra,
            "server_usec_per_return_1": one_script_us,
            "server_commands_per_cycle": _per_grant(_diff(stats0, stats1), extra),
            "ping_ns": _summary_dict(ping),
            "evalsha_return_1_ns": _summary_dict(evalsha),
            "acquire_ns": _summary_dict(acquire),
            "release_ns": _summary_dict(release),
            "cycle_ns": _summary_dict(cycle),
        }
        # The floor's cycle (figure 1f), where the server has Functions: a
        # pass of its own, after figure 1's, each sample next to a PING.
        # Interleaved with the pool's cycle, the floor's library took the
        # server's caches from the pool's and slowed figure 1 by a tenth.
        floor_ping, floors = self._floor_cycles()
        if floors:
            self.details["uncontended"]["floor_ping_ns"] = _summary_dict(floor_ping)
            self.details["uncontended"]["floor_cycle_ns"] = _summary_dict(floors)
        cycle_p50, ping_p50 = _p(cycle, "p50"), _p(ping, "p50")
        self.add(
            Row(
                "1",
                "uncontended acquire+release, p50",
                cycle_p50,
                "ns",
                ping_p50,
                "PING p50",
                Target("<=", 2.5),
                note=f"acquire p50 {format_value(_p(acquire, 'p50'), 'ns')}, "
                f"release p50 {format_value(_p(release, 'p50'), 'ns')}, "
                f"EVALSHA 'return 1' p50 {format_value(_p(evalsha, 'p50'), 'ns')}; "
                f"{lib_calls / extra:.2f} script calls per cycle; server time per call "
                f"{_us(lib_script_us)} (acquire/release; "
                f"{_us(ev_usec / ev_calls if ev_calls else None)} with the event log on) "
                f"vs {_us(one_script_us)} ('return 1')",
            )
        )
        self.add(
            Row(
                "1f",
                "floor: the same cycle, a grant's commands only, p50",
                _p(floors, "p50") if floors else None,
                "ns",
                _p(floor_ping, "p50") if floors else None,
                "PING p50, same pass",
                note="two FCALLs of a bare library that sends only the commands a "
                "queued, fenced, leased grant needs (allocator/cli/bench/floor.py), "
                "in a pass of its own after figure 1's, each sample next to a PING"
                if floors
                else "not measured: the server has no Functions, or the user may not load them",
            )
        )
        self.progress.end(
            f"cycle p50 {format_value(cycle_p50, 'ns')}, PING p50 {format_value(ping_p50, 'ns')}"
        )

    def _floor_cycles(self) -> tuple[list[int], list[int]]:
        """PING and the floor's cycle, in ns, sample by sample (both empty
        where the server has no Functions)."""
        floor = Floor.start(self.node, f"{self.prefix}:{{{self.fresh('floor')}}}")
        if floor is None:
            return [], []
        ping: list[int] = []
        cycle: list[int] = []
        now = time.monotonic_ns
        warmup = min(200, self.plan.uncontended_samples // 10)
        try:
            for i in range(warmup + self.plan.uncontended_samples):
                t0 = now()
                self.node.ping()
                t1 = now()
                floor.once()
                t2 = now()
                if i >= warmup:
                    ping.append(t1 - t0)
                    cycle.append(t2 - t1)
        finally:
            floor.close()
        return ping, cycle
