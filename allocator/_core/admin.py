"""A pool's administration: adding and removing resources, bindings,
quarantine, deletion, gc, and the read-only views (status, leases, stats).
Each is a single call, or a bounded walk of single calls (extend and
remove in chunks, gc by cursors)."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from .._values import (
    ClientInfo,
    GCReport,
    LeaseInfo,
    PoolStats,
    PoolStatus,
    ResourceStatus,
    TenantStatus,
)
from ..errors import AllocatorError, SeveralLeases, UnknownResource
from .base import PoolBase
from .checks import (
    MAX_EVENTS,
    MAX_LEASE_ID,
    MAX_PRIORITY,
    MAX_RESOURCE,
    MAX_TOKEN,
    _int,
    _ms,
    _order,
    _resources,
    _seconds,
    _shown,
    _tenant,
    _text,
    _weight,
)
from .clients import clients_of
from .keys import KEY_SUFFIXES
from .replies import _decode, _tagged, _unexpected, stats_from_fields
from .retry import SIDE_BUDGET
from .steps import Call, Command, Flow, Sleep

_log = logging.getLogger("allocator")

#: Resources per script run in extend/remove, so one huge call does not
#: block the server for long; each run leaves the pool consistent. A
#: resource costs each about 20 us of server time (Redis 7.0): a run of 100
#: takes about 2 ms, as a page of status does (500 took 10 ms, and 50,000
#: resources kept a PING beside them waiting up to 0.1 s on a busy host).
CHUNK = 100
#: Entries per gc step.
GC_COUNT = 100
#: How long after the last grace it found running ``gc()`` walks the queue
#: again (server time runs on meanwhile: a little more than the grace).
GC_GRACE_SLACK = 0.05
#: Resources (status) or leases (leases) read per script run, so that no
#: run blocks the server for more than about 3 ms however large the pool
#: (docs/scripts/status_stall.py).
PAGE = 250
#: Tickets of the queue indexed per script run when the order turns to
#: ``tenant`` (lua/set_order.lua): about what a gc step reads.
ORDER_STEP = 200
#: A tenant's count, as the scripts keep it: this many units a grant at
#: weight 1 (lua/prelude_tenants.lua).
TENANT_UNIT = 10_000


class Admin(PoolBase):
    """Administration and views (see :class:`~.pool.Pool`)."""

    __slots__ = ()

    def _check_policy(self) -> Flow[None]:
        """Warn (once per allocator) if the server may evict the pool's keys.

        The pool uses no keys with a TTL, so ``volatile-*`` policies never
        touch it; an ``allkeys-*`` policy can evict a lease or the queue.
        Run by the admin operations, so the hot path stays one round trip;
        a server that refuses CONFIG (an ACL, a managed service) is skipped.
        """
        if self._policy_checked:
            return
        self._policy_checked = True
        try:
            due = time.monotonic() + SIDE_BUDGET
            reply = yield Command(("CONFIG", "GET", "maxmemory-policy"), due)
        except Exception:
            return
        # CONFIG GET answers a flat list on RESP2 and a map on RESP3.
        values = list(reply.values()) if isinstance(reply, dict) else list(reply or [])[1::2]
        policy = _decode(values[0]) if values else ""
        if policy.startswith("allkeys"):
            warnings.warn(
                f"Redis maxmemory-policy is {policy!r}: under memory pressure the server may "
                f"evict keys of pool {self.name!r} (leases, the queue). Use 'noeviction' or a "
                "volatile-* policy; the pool's keys have no TTL.",
                RuntimeWarning,
                stacklevel=2,
            )

    def extend(
        self, resources: object, capacity: object, priority: object, rate: object
    ) -> Flow[int]:
        names = _resources(resources)
        capacity = _int("capacity", capacity, 1, 2**31)
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise TypeError(f"priority must be a number, not {type(priority).__name__}")
        priority = int(priority) if isinstance(priority, int) else float(priority)
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:  # also NaN, inf and 10**400
            raise ValueError(
                f"priority must be a finite number within +-{MAX_PRIORITY:.0e}, "
                f"got {_shown(priority)}"
            )
        score = repr(-priority) if isinstance(priority, float) else str(-priority)
        count, window_ms = 0, 0
        if rate is not None:
            if not isinstance(rate, (tuple, list)) or len(rate) != 2:
                raise TypeError("rate must be a (count, seconds) pair or None")
            count = _int("rate count", rate[0], 1, 1_000_000)
            window_ms = _ms(_seconds("rate seconds", rate[1]))
        return self._chunked("extend", names, (capacity, score, count, window_ms), "extended")

    def remove(self, resources: object, force: object) -> Flow[int]:
        names = _resources(resources)
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, not {type(force).__name__}")
        return self._chunked("remove", names, ("1" if force else "0",), "removed")

    def _chunked(
        self, op: str, names: list[str], head: tuple[str | int, ...], tag: str
    ) -> Flow[int]:
        def parse(reply: Any) -> int:
            got, rest = _tagged(op, reply)
            if got != tag or len(rest) != 1:
                raise _unexpected(op, reply)
            return int(rest[0])

        yield from self._check_policy()
        total = 0
        for start in range(0, len(names), CHUNK):
            call = Call(op, self.keys, head + tuple(names[start : start + CHUNK]), parse)
            total += yield from self._single(call)
        return total

    def bind(self, name: object, resource: object) -> Flow[None]:
        name = _text("name", name, MAX_RESOURCE)
        resource = _text("resource", resource, MAX_RESOURCE)

        def parse(reply: Any) -> None:
            tag, rest = _tagged("bind", reply)
            if tag == "unknown" and not rest:
                raise UnknownResource(self.name, resource)
            if tag != "bound" or rest:
                raise _unexpected("bind", reply)

        return self._single(Call("bind", self.keys, (name, resource, _ms(self.bind_ttl)), parse))

    def unbind(self, name: object) -> Flow[bool]:
        name = _text("name", name, MAX_RESOURCE)

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("unbind", reply)
            if tag != "unbound" or len(rest) != 1:
                raise _unexpected("unbind", reply)
            return int(rest[0]) == 1

        return self._single(Call("unbind", self.keys, (name,), parse))

    def status(self) -> Flow[PoolStatus]:
        """A snapshot of the pool, read a page of resources per script run
        (lua/status.lua), so that no run blocks the server for long however
        large the pool; the header (queue, bindings) is the first page's."""
        yield from self._check_policy()
        head: tuple[list[int], str, bool] | None = None
        rows: dict[str, ResourceStatus] = {}
        cursor = "0"
        while True:
            call = Call("status", self.keys, (cursor, PAGE), self._status_page)
            page_head, cursor, page = yield from self._single(call)
            head = head or page_head
            # HSCAN may return a resource twice (a rehash between pages).
            rows.update((row.name, row) for row in page)
            if cursor == "0":
                break
        (now_us, exists, waiting, oldest_ms, bindings, hits, misses), order, named = head
        tenants = (yield from self._tenants()) if named else ()
        shown = sorted(rows.values(), key=lambda row: row.name)
        return PoolStatus(
            name=self.name,
            size=len(shown),
            free=sum(1 for row in shown if row.state == "free"),
            leased=sum(row.leases for row in shown),
            waiting=max(waiting, 0),
            resources=tuple(shown),
            bindings=bindings,
            bind_hits=hits,
            bind_misses=misses,
            server_time=now_us / 1e6,
            oldest_wait=oldest_ms / 1000,
            exists=exists == 1,
            absent_holders=sum(row.absent_holders for row in shown),
            order=order,
            tenants=tenants,
        )

    @staticmethod
    def _status_page(
        reply: Any,
    ) -> tuple[tuple[list[int], str, bool], str, list[ResourceStatus]]:
        """One page of status.lua: its header (the figures, the order,
        whether requests name tenants), the next cursor, its rows."""
        tag, rest = _tagged("status", reply)
        if tag != "status" or len(rest) < 10 or (len(rest) - 10) % 4:
            raise _unexpected("status", reply)
        head = [int(x) for x in rest[:7]]
        order, named = _decode(rest[7]), int(rest[8]) == 1
        now_ms = head[0] // 1000
        rows = []
        for i in range(10, len(rest), 4):
            name, record = _decode(rest[i]), _decode(rest[i + 1])
            cap, score, used, _fence, state, until, _stamp, rc, rw, _rv = record.split("|")
            # The script wrote nothing: what a writer would handle first is
            # accounted for here. Leases past their deadline are not live; a
            # quarantine or throttle that ended is over.
            capacity, leases = int(cap), max(int(used) - int(rest[i + 2]), 0)
            parked = state in ("q", "t") and int(until) > now_ms
            if state == "d":
                shown = "draining"
            elif parked:
                shown = "quarantined"
            else:
                shown = "free" if leases < capacity else "leased"
            rows.append(
                ResourceStatus(
                    name=name,
                    capacity=capacity,
                    priority=0.0 - float(score),
                    leases=leases,
                    state=shown,
                    until=int(until) / 1000 if parked else None,
                    throttled=parked and state == "t",
                    rate=(int(rc), int(rw) / 1000) if int(rc) else None,
                    absent_holders=int(rest[i + 3]),
                )
            )
        return (head, order, named), _decode(rest[9]), rows

    def _tenants(self) -> Flow[tuple[TenantStatus, ...]]:
        """The pool's tenants (lua/tenants.lua: a page of the queue, then of
        the tenants' figures, per script run), by name."""
        found: dict[str, dict[str, Any]] = {}
        total = [0, 0]  # the pool's grants, the server time (ms)

        def parse(reply: Any) -> str:
            tag, rest = _tagged("tenants", reply)
            if tag != "tenants" or len(rest) < 3 or (len(rest) - 3) % 5:
                raise _unexpected("tenants", reply)
            total[0], total[1] = int(rest[2]), int(rest[0]) // 1000
            for i in range(3, len(rest), 5):
                kind, name, a, b, c = (_decode(x) for x in rest[i : i + 5])
                row = found.setdefault(name, {"waiting": 0, "leases": 0, "first": None})
                if kind == "q":
                    row["waiting"] += int(a)
                    row["leases"] += int(b)
                    if c and row["first"] is None:
                        row["first"] = int(c.partition("-")[0])
                elif kind == "g":
                    row["grants"] = int(a)
                elif kind == "w":
                    row["weight"] = float(a)
                elif kind == "c":
                    row["count"] = int(a, 16) / TENANT_UNIT
            return _decode(rest[1])

        cursor = ""
        for _ in range(1_000_000):
            cursor = yield from self._single(Call("tenants", self.keys, (cursor, PAGE), parse))
            if not cursor:
                break
        named = sum(row.get("grants", 0) for name, row in found.items() if name)
        if "" in found or total[0] > named:
            found.setdefault("", {"waiting": 0, "leases": 0, "first": None})
            found[""]["grants"] = max(total[0] - named, 0)
        now_ms = total[1]
        return tuple(
            TenantStatus(
                name=name,
                waiting=row["waiting"],
                leases=row["leases"],
                grants=row.get("grants", 0),
                weight=row.get("weight", 1.0),
                count=row.get("count", 0.0),
                oldest_wait=0.0 if row["first"] is None else max(now_ms - row["first"], 0) / 1000,
            )
            for name, row in sorted(found.items())
        )

    def set_order(self, order: object) -> Flow[None]:
        """The pool's order (lua/set_order.lua): a switch to ``tenant``
        builds the index of the waiting tickets in bounded steps, each one
        script run, until it is whole."""
        wanted = _order(order)

        def parse(reply: Any) -> str:
            tag, rest = _tagged("set_order", reply)
            if tag != "order" or len(rest) != 1:
                raise _unexpected("set_order", reply)
            return _decode(rest[0])

        yield from self._check_policy()
        # Each step indexes GC_COUNT more tickets of the queue, which only
        # grows so far: a queue that grows faster than that is rare, and
        # the loop is bounded all the same.
        for _ in range(1_000_000):
            got = yield from self._single(Call("set_order", self.keys, (wanted, ORDER_STEP), parse))
            if got != "building":
                return
        raise AllocatorError(f"pool {self.name!r}: the switch to the order {wanted!r} did not end")

    def set_weight(self, tenant: object, weight: object) -> Flow[None]:
        name = _tenant(tenant)
        number = _weight(weight)

        def parse(reply: Any) -> None:
            tag, rest = _tagged("set_weight", reply)
            if tag != "weight" or rest:
                raise _unexpected("set_weight", reply)

        return self._single(Call("set_weight", self.keys, (name, repr(number)), parse))

    def leases(self) -> Flow[tuple[LeaseInfo, ...]]:
        """Every live lease, read a page of the lease index per script run
        (lua/leases.lua)."""

        def parse(reply: Any) -> tuple[str, list[LeaseInfo]]:
            tag, rest = _tagged("leases", reply)
            if tag != "leases" or len(rest) < 2 or (len(rest) - 2) % 8:
                raise _unexpected("leases", reply)
            out = []
            for i in range(2, len(rest), 8):
                resource, token, owner, granted_us, deadline_ms, present, cid, tenant = (
                    _decode(x) for x in rest[i : i + 8]
                )
                out.append(
                    LeaseInfo(
                        resource=resource,
                        token=int(token),
                        owner=owner,
                        granted_at=int(granted_us) / 1e6,
                        expires_at=int(deadline_ms) / 1000,
                        holder_present=None if int(present) < 0 else int(present) == 1,
                        client=cid,
                        tenant=tenant,
                    )
                )
            return _decode(rest[1]), out

        found: list[LeaseInfo] = []
        after = ""
        while True:
            after, page = yield from self._single(Call("leases", self.keys, (after, PAGE), parse))
            found += page
            if not after:
                break
        found.sort(key=lambda info: (info.resource, info.granted_at, info.token))
        return tuple(found)

    def clients(self) -> Flow[tuple[ClientInfo, ...]]:
        """Every client of the pool (lua/clients.lua: a page of liveness
        marks or of the queue per script run), with its waiters and leases,
        its silence and whether it is stalled (:mod:`.clients`)."""
        rows: list[tuple[str, str, str, int, str]] = []

        def parse(reply: Any) -> tuple[int, str]:
            tag, rest = _tagged("clients", reply)
            if tag != "clients" or len(rest) < 2 or (len(rest) - 2) % 5:
                raise _unexpected("clients", reply)
            for i in range(2, len(rest), 5):
                kind, cid, mark, present, info = (_decode(x) for x in rest[i : i + 5])
                rows.append((kind, cid, mark, int(present), info))
            return int(rest[0]), _decode(rest[1])

        now_us, cursor = 0, ""
        while True:
            now_us, cursor = yield from self._single(
                Call("clients", self.keys, (cursor, PAGE), parse)
            )
            if not cursor:
                break
        return clients_of(rows, now_us // 1000)

    def stats(self) -> Flow[PoolStats]:
        def parse(reply: Any) -> PoolStats:
            tag, rest = _tagged("stats", reply)
            if tag != "stats" or not rest or (len(rest) - 1) % 2:
                raise _unexpected("stats", reply)
            fields = {_decode(rest[i]): int(rest[i + 1]) for i in range(1, len(rest), 2)}
            return stats_from_fields(self.name, fields, int(rest[0]) / 1e6)

        return self._single(Call("stats", self.keys, (), parse))

    def quarantine(self, resource: object, seconds: object) -> Flow[None]:
        resource = _text("resource", resource, MAX_RESOURCE)
        ms = _ms(_seconds("seconds", seconds))

        def parse(reply: Any) -> None:
            tag, rest = _tagged("quarantine", reply)
            if tag == "unknown" and not rest:
                raise UnknownResource(self.name, resource)
            if not ((tag == "quarantined" and len(rest) == 1) or (tag == "draining" and not rest)):
                raise _unexpected("quarantine", reply)

        yield from self._check_policy()
        return (yield from self._single(Call("quarantine", self.keys, (resource, ms), parse)))

    def revoke(self, resource: object, token: object, lease_id: object) -> Flow[bool]:
        """One lease ended now, named either by ``lease_id`` (its holder's
        own code) or as an operator sees it: by ``resource`` and, where the
        resource holds several leases, ``token`` (lua/revoke.lua)."""
        if lease_id is not None:
            if resource is not None or token is not None:
                raise TypeError("revoke takes a resource (and token) or a lease_id, not both")
            args: tuple[str, ...] = ("id", _text("lease_id", lease_id, MAX_LEASE_ID))
            resource = None
        elif resource is None:
            raise TypeError("revoke needs a resource (and token), or a lease_id")
        else:
            resource = _text("resource", resource, MAX_RESOURCE)
            shown = "" if token is None else str(_int("token", token, 1, MAX_TOKEN))
            args = ("res", resource, shown)

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("revoke", reply)
            if tag == "several" and len(rest) > 1 and isinstance(resource, str):
                raise SeveralLeases(self.name, resource, tuple(sorted(int(t) for t in rest)))
            if (tag == "revoked" and len(rest) == 1) or (tag == "unknown" and not rest):
                return tag == "revoked"
            raise _unexpected("revoke", reply)

        return self._single(Call("revoke", self.keys, args, parse))

    def set_events(self, maxlen: object) -> Flow[None]:
        n = 0 if maxlen is None else _int("maxlen", maxlen, 1, MAX_EVENTS)

        def parse(reply: Any) -> None:
            tag, rest = _tagged("set_events", reply)
            if tag != "events" or len(rest) != 1:
                raise _unexpected("set_events", reply)

        yield from self._check_policy()
        return (yield from self._single(Call("set_events", self.keys, (n,), parse)))

    @property
    def events_key(self) -> str:
        return str(self.keys[KEY_SUFFIXES.index("events")])

    def unquarantine(self, resource: object) -> Flow[bool]:
        resource = _text("resource", resource, MAX_RESOURCE)

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("unquarantine", reply)
            if tag == "unknown" and not rest:
                raise UnknownResource(self.name, resource)
            if tag not in ("ended", "none") or rest:
                raise _unexpected("unquarantine", reply)
            return tag == "ended"

        return self._single(Call("unquarantine", self.keys, (resource,), parse))

    def delete(self, force: object) -> Flow[bool]:
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, not {type(force).__name__}")

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("delete", reply)
            if tag == "absent" and not rest:
                return False
            if tag == "busy" and len(rest) == 2:
                leases, waiting = int(rest[0]), int(rest[1])
                plural = "" if leases == 1 else "s"
                raise AllocatorError(
                    f"pool {self.name!r} is in use ({leases} live lease{plural}, "
                    f"{waiting} waiting): nothing was deleted; delete(force=True) revokes "
                    "the leases and turns the waiters away"
                )
            if tag == "deleted" and len(rest) == 2:
                _log.info(
                    "allocator: pool %r deleted (%d leases revoked, %d waiters turned away)",
                    self.name,
                    int(rest[0]),
                    int(rest[1]),
                )
                return True
            raise _unexpected("delete", reply)

        return self._single(Call("delete", self.keys, ("1" if force else "0",), parse))

    def gc(self) -> Flow[GCReport]:
        def parse(reply: Any) -> tuple[list[int], str, str, str, bool, int]:
            tag, rest = _tagged("gc", reply)
            if tag != "gc" or len(rest) != 11:
                raise _unexpected("gc", reply)
            counts = [int(x) for x in rest[:6]]
            leased, queue, res = (_decode(x) for x in rest[6:9])
            return counts, leased, queue, res, int(rest[9]) == 1, int(rest[10])

        yield from self._check_policy()
        totals = [0] * 6
        leased, queue, res = "0", "", "0"
        absent_ms = 0
        waited = 0.0
        # Each step is bounded; the cursors walk the lease records, the queue
        # and the resources once, so the loop ends even while the pool is busy.
        for _ in range(100_000):
            call = Call("gc", self.keys, (leased, queue, res, GC_COUNT), parse)
            counts, leased, queue, res, more, absent = yield from self._single(call)
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            absent_ms = max(absent_ms, absent)
            if leased == "0" and queue == "" and res == "" and not more:
                if not absent_ms or waited:
                    break
                # Waiters of clients found absent, whose graces run: wait
                # them out (a grace at most) and walk the queue once more,
                # so that one call leaves no dead waiter behind.
                waited = absent_ms / 1000 + GC_GRACE_SLACK
                yield Sleep(waited)
                leased, queue, res = "0", "", ""
        reclaimed, dropped, expired, unparked, orphans, repaired = totals
        return GCReport(
            reclaimed=reclaimed,
            dropped_waiters=dropped,
            expired_bindings=expired,
            unparked=unparked,
            orphans=orphans,
            repaired=repaired,
            waited=waited,
        )
