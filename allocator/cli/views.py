"""``allocator pools``, ``status``, ``watch``, ``leases`` and ``clients``:
what a pool holds, who holds it (which process, connected, gone or
stalled), who waits, and its counters. Every read here writes nothing (a
read-only ACL user may run them)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from allocator import ClientInfo, LeaseInfo, PoolStats, PoolStatus, ResourceStatus

from ._common import (
    CommandError,
    Connection,
    add_connection,
    ago,
    connect,
    console,
    iso,
    positive_float,
    positive_int,
    sigterm_ends,
)

__all__ = ["Snapshot", "register", "render", "snapshot_json"]


def register(commands: Any) -> None:
    pools = commands.add_parser(
        "pools", help="list the pools on the server: size, free, leased, waiting"
    )
    add_connection(pools)
    pools.add_argument("--json", action="store_true", help="print JSON for scripts")
    pools.set_defaults(run=_pools)

    status = commands.add_parser(
        "status", help="one pool: resources, leases (who, how long), queue, counters"
    )
    status.add_argument("pool", help="the pool's name")
    add_connection(status)
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument(
        "--resource",
        action="append",
        default=None,
        metavar="R",
        help="only resource R and its leases (may be given again)",
    )
    status.add_argument(
        "--state",
        action="append",
        choices=("free", "leased", "quarantined", "draining"),
        default=None,
        help="only resources in this state, and their leases (may be given again)",
    )
    status.add_argument(
        "--owner",
        action="append",
        default=None,
        metavar="O",
        help="only the leases of owner O, and their resources (may be given again)",
    )
    status.set_defaults(run=_status)

    watch = commands.add_parser(
        "watch",
        help="the status view, refreshed until Ctrl-C or SIGTERM (waits for a pool not made yet)",
    )
    watch.add_argument("pool", help="the pool's name")
    add_connection(watch)
    watch.add_argument(
        "--interval",
        type=positive_float,
        default=2.0,
        metavar="S",
        help="seconds between refreshes (2)",
    )
    watch.add_argument(
        "--count",
        type=positive_int,
        default=None,
        metavar="N",
        help="stop after N refreshes (default: until Ctrl-C or SIGTERM); a refresh that "
        "finds no pool counts too, and if the last one does, the exit status is 1",
    )
    watch.set_defaults(run=_watch)

    leases = commands.add_parser(
        "leases",
        help="one pool's live leases: resource, token, owner, client, presence, granted, deadline",
    )
    leases.add_argument("pool", help="the pool's name")
    add_connection(leases)
    leases.add_argument("--json", action="store_true", help="print JSON for scripts")
    leases.set_defaults(run=_leases)

    clients = commands.add_parser(
        "clients",
        help="one pool's client processes: id, host, pid, version, presence, last seen, "
        "waiters, leases",
    )
    clients.add_argument("pool", help="the pool's name")
    add_connection(clients)
    clients.add_argument("--json", action="store_true", help="print JSON for scripts")
    clients.set_defaults(run=_clients)


# -- reading --------------------------------------------------------------------


@attrs.frozen
class Snapshot:
    """What one look at a pool shows: its status, leases and counters."""

    status: PoolStatus
    leases: tuple[LeaseInfo, ...]
    stats: PoolStats
    where: str
    clients: tuple[ClientInfo, ...] = ()

    def client(self, cid: str) -> ClientInfo | None:
        return next((c for c in self.clients if c.id == cid), None)

    @property
    def stalled(self) -> tuple[ClientInfo, ...]:
        return tuple(c for c in self.clients if c.stalled)

    #: The resources shown (status --resource/--state/--owner); None: all.
    shown: tuple[ResourceStatus, ...] | None = None


def take(conn: Connection, name: str) -> Snapshot:
    snap = look(conn, name)
    if snap is None:
        raise CommandError(_no_pool(conn, name))
    return snap


def look(conn: Connection, name: str) -> Snapshot | None:
    """A snapshot of the pool, or None when it does not exist (yet)."""
    pool = conn.pool(name)
    status = pool.status()
    if not status.exists:
        return None
    return Snapshot(status, pool.leases(), pool.stats(), conn.shown, pool.clients())


def _no_pool(conn: Connection, name: str) -> str:
    return f"no pool named {name!r} (prefix {conn.prefix!r}) on {conn.shown}"


# -- pools ------------------------------------------------------------------------


def _pools(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        rows: list[dict[str, Any]] = []
        for name in conn.pools():
            st = conn.pool(name).status()
            rows.append(
                {
                    "pool": name,
                    "size": st.size,
                    "free": st.free,
                    "slots": sum(r.capacity for r in st.resources),
                    "free_slots": sum(
                        r.capacity - r.leases for r in st.resources if r.state == "free"
                    ),
                    "leased": st.leased,
                    "waiting": st.waiting,
                    "oldest_wait_seconds": st.oldest_wait,
                }
            )
    finally:
        conn.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    out = console()
    if not rows:
        out.print(f"no pools under prefix {conn.prefix!r} on {conn.shown}")
        return 0
    table = Table(title=f"pools on {conn.shown} (prefix {conn.prefix!r})", title_justify="left")
    # Each column counts one thing: resources, or slots (a resource of
    # capacity n has n), or leases.
    columns = ("pool", "resources", "slots", "free slots", "leases", "waiting", "oldest wait")
    for column in columns:
        table.add_column(column, justify="left" if column == "pool" else "right")
    for row in rows:
        table.add_row(
            row["pool"],
            str(row["size"]),
            str(row["slots"]),
            str(row["free_slots"]),
            str(row["leased"]),
            str(row["waiting"]),
            ago(row["oldest_wait_seconds"]) if row["waiting"] else "-",
        )
    out.print(table)
    return 0


# -- status ------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        snap = take(conn, args.pool)
    finally:
        conn.close()
    snap = _only(snap, args.resource, args.state, args.owner)
    if args.json:
        print(json.dumps(snapshot_json(snap), indent=2))
    else:
        console().print(render(snap))
    return 0


def _only(
    snap: Snapshot, names: list[str] | None, states: list[str] | None, owners: list[str] | None
) -> Snapshot:
    """The snapshot with only the resources and leases the filters keep
    (``status --resource/--state/--owner``); the pool-wide figures (the
    headline, the counters) stay whole."""
    if not (names or states or owners):
        return snap
    rows = [
        r
        for r in snap.status.resources
        if (not names or r.name in names) and (not states or r.state in states)
    ]
    kept = {r.name for r in rows}
    leases = tuple(
        i for i in snap.leases if i.resource in kept and (not owners or i.owner in owners)
    )
    if owners:
        held = {i.resource for i in leases}
        rows = [r for r in rows if r.name in held]
    return attrs.evolve(snap, shown=tuple(rows), leases=leases)


def _watch(args: argparse.Namespace) -> int:
    conn = connect(args)
    # SIGTERM (a service manager, `timeout`) ends the watch like Ctrl-C,
    # but as a normal end: exit status 0.
    try:
        with sigterm_ends():
            if sys.stdout.isatty():
                return _watch_live(conn, args)
            return _watch_plain(conn, args)
    finally:
        conn.close()


def _looks(conn: Connection, args: argparse.Namespace) -> Iterator[Snapshot | None]:
    """A look at the pool every ``--interval`` seconds, ``--count`` times
    (else forever). A pool that does not exist (yet, or any more) is waited
    for, saying so once on stderr; with ``--count``, a pool still missing at
    the last look is an error, said in one line (the error) alone."""
    said = False
    count = 0
    while True:
        snap = look(conn, args.pool)
        if snap is None and not said and args.count is None:
            print(
                f"allocator watch: {_no_pool(conn, args.pool)} yet; waiting for it "
                "(Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
        said = snap is None
        count += 1
        last = args.count is not None and count >= args.count
        if last and snap is None:
            raise CommandError(_no_pool(conn, args.pool))
        yield snap
        if last:
            return
        time.sleep(args.interval)


def _waiting_text(conn: Connection, name: str) -> Text:
    return Text(f"waiting for pool {name!r} (prefix {conn.prefix!r}) on {conn.shown} to exist")


def _watch_live(conn: Connection, args: argparse.Namespace) -> int:
    looks = _looks(conn, args)
    first = next(looks)
    view = render(first) if first is not None else _waiting_text(conn, args.pool)
    with Live(view, console=console(), auto_refresh=False, screen=False) as live:
        for snap in looks:
            live.update(
                render(snap) if snap is not None else _waiting_text(conn, args.pool),
                refresh=True,
            )
    return 0


def _watch_plain(conn: Connection, args: argparse.Namespace) -> int:
    # Not a terminal: one snapshot per interval, one after the other.
    plain = console()
    for snap in _looks(conn, args):
        if snap is not None:
            plain.print(render(snap))
            print(flush=True)
    return 0


_STATE_STYLE = {"free": "green", "leased": "yellow", "quarantined": "red", "draining": "magenta"}


def render(snap: Snapshot) -> Group:
    """The human view of a snapshot: a heading, resources, leases, counters."""
    st, now = snap.status, snap.status.server_time
    head = Text()
    head.append(f"pool {st.name!r}", style="bold")
    head.append(f" on {snap.where}: {headline(st)}")
    clock = Text(f"server time {iso(now)}", style="dim")

    resources = Table(title="resources", title_justify="left", expand=False)
    for column in ("resource", "state", "leases", "capacity", "priority", "rate", "until"):
        resources.add_column(
            column, justify="right" if column in ("leases", "capacity") else "left"
        )
    for row in st.resources if snap.shown is None else snap.shown:
        rate = f"{row.rate[0]} / {_num(row.rate[1])} s" if row.rate else "-"
        until = "-"
        if row.until is not None:
            until = f"in {ago(row.until - now)}" + (" (rate)" if row.throttled else "")
        resources.add_row(
            row.name,
            Text(row.state, style=_STATE_STYLE.get(row.state, "")),
            str(row.leases),
            str(row.capacity),
            _num(row.priority),
            rate,
            until,
        )

    leases = Table(title="leases", title_justify="left", expand=False)
    # A tenant column where a lease names one (docs/concepts.md#tenants).
    named = any(info.tenant for info in snap.leases)
    for column in ("resource", "owner", "holder", "token", "held for", "expires in"):
        leases.add_column(column)
    if named:
        leases.add_column("tenant")
    for info in snap.leases:
        leases.add_row(
            info.resource,
            info.owner,
            holder_text(info, snap.client(info.client)),
            str(info.token),
            ago(now - info.granted_at),
            ago(info.expires_at - now),
            *((info.tenant or "-",) if named else ()),
        )
    if not snap.leases:
        leases.add_row("-", "nobody holds a lease", "", "", "", "")

    s = snap.stats
    waits = "-"
    if s.grants:
        waits = (
            f"mean {ago(s.wait_seconds_sum / s.grants)}, p50 {_quantile(s, 0.5)}, "
            f"p99 {_quantile(s, 0.99)}"
        )
    counters = Text(
        f"since created: {s.grants} grants, {s.timeouts} timeouts, {s.reclaimed} reclaimed, "
        f"{s.revoked} revoked, {s.dropped_waiters} dropped waiters, "
        f"{s.quarantined_on_release + s.quarantined_by_operator} quarantines "
        f"({s.quarantined_on_release} on release, {s.quarantined_by_operator} by operators); "
        f"wait {waits}",
        style="dim",
    )
    parts: list[Any] = [head, clock, resources, leases]
    if st.tenants:
        parts.append(tenants_table(st))
    if snap.stalled:
        parts.append(
            Text(
                "stalled (connected, silent past their heartbeat): "
                + ", ".join(_client_name(c) for c in snap.stalled),
                style="bold yellow",
            )
        )
    return Group(*parts, counters)


#: The holder column of the leases table: its presence
#: (docs/concepts.md#presence-as-a-session).
_HOLDER = {
    True: Text("connected", style="green"),
    False: Text("GONE", style="bold red"),
    None: Text("-", style="dim"),
}


def holder_text(info: LeaseInfo, client: ClientInfo | None) -> Text:
    """The presence of a lease's holder: connected, GONE, ``stalled 6 s``
    (connected, but silent past its heartbeat), or - (nobody can tell)."""
    if client is not None and client.stalled and client.silent_for is not None:
        return Text(f"stalled {ago(client.silent_for)}", style="bold yellow")
    return _HOLDER[info.holder_present]


def _client_name(client: ClientInfo) -> str:
    where = f"{client.host}:{client.pid}" if client.host else client.id
    silent = "" if client.silent_for is None else f" {ago(client.silent_for)}"
    return f"{where} ({client.id}){silent}"


def _presence_word(present: bool | None, client: ClientInfo | None) -> str:
    """The presence for JSON: connected, gone, stalled or unknown."""
    if client is not None and client.stalled:
        return "stalled"
    return {True: "connected", False: "gone", None: "unknown"}[present]


def tenants_table(st: PoolStatus) -> Table:
    """One row per tenant: who waits, holds and was granted, its weight
    and, under the order ``tenant``, its count (docs/concepts.md#tenants)."""
    table = Table(title=f"tenants (order {st.order})", title_justify="left", expand=False)
    columns = ["tenant", "waiting", "leases", "grants", "weight", "oldest wait"]
    if st.order != "fifo":
        columns.append("count")
    for column in columns:
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for t in st.tenants:
        table.add_row(
            t.name or "(none)",
            str(t.waiting),
            str(t.leases),
            str(t.grants),
            _num(t.weight),
            ago(t.oldest_wait) if t.waiting else "-",
            *((f"{t.count:.4g}",) if st.order != "fifo" else ()),
        )
    return table


def headline(st: PoolStatus) -> str:
    """The pool in one line, in resources and leases with capacity in mind:
    ``4 resources (8 slots): 7 free slots, 1 lease, 0 waiting``; where every
    capacity is 1, ``4 resources: 3 free, 1 lease, 0 waiting``. Resources
    out of rotation follow: ``; 1 quarantined, 1 rate-limited, 1 draining``."""
    slots = sum(row.capacity for row in st.resources)
    # A slot is free when it can be granted now: on a resource in rotation.
    free = sum(row.capacity - row.leases for row in st.resources if row.state == "free")
    text = _count(st.size, "resource")
    if slots != st.size:
        text += f" ({_count(slots, 'slot')}): {_count(free, 'free slot')}"
    else:
        text += f": {free} free"
    text += f", {_count(st.leased, 'lease')}, {st.waiting} waiting"
    if st.waiting:
        text += f" (oldest for {ago(st.oldest_wait)})"
    out = {
        "quarantined": sum(
            1 for row in st.resources if row.state == "quarantined" and not row.throttled
        ),
        "rate-limited": sum(
            1 for row in st.resources if row.state == "quarantined" and row.throttled
        ),
        "draining": sum(1 for row in st.resources if row.state == "draining"),
    }
    if any(out.values()):
        text += "; " + ", ".join(f"{n} {what}" for what, n in out.items() if n)
    if st.absent_holders:
        text += f"; {_count(st.absent_holders, 'lease')} of a holder gone"
    if st.order != "fifo":
        text += f"; order {st.order}"
    return text


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _quantile(stats: PoolStats, q: float) -> str:
    """The bucket bound under which a share ``q`` of the waits fell."""
    want = q * stats.grants
    for bound, count in stats.wait_seconds:
        if count >= want:
            return "> 300 s" if bound == float("inf") else f"<= {ago(bound)}"
    return "-"


def _num(value: float) -> str:
    return f"{value:g}"


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The same facts as :func:`render`, for scripts: seconds, and ISO times."""
    st, now = snap.status, snap.status.server_time
    return {
        "pool": st.name,
        "server_time": now,
        "server_time_iso": iso(now),
        "size": st.size,
        "free": st.free,
        "leased": st.leased,
        "waiting": st.waiting,
        "oldest_wait_seconds": st.oldest_wait,
        "absent_holders": st.absent_holders,
        "stalled": len(snap.stalled),
        "order": st.order,
        "tenants": [
            {
                "name": t.name,
                "waiting": t.waiting,
                "leases": t.leases,
                "grants": t.grants,
                "weight": t.weight,
                "count": t.count,
                "oldest_wait_seconds": t.oldest_wait,
            }
            for t in st.tenants
        ],
        "resources": [
            {
                "name": r.name,
                "state": r.state,
                "capacity": r.capacity,
                "leases": r.leases,
                "priority": r.priority,
                "rate": None if r.rate is None else {"count": r.rate[0], "seconds": r.rate[1]},
                "quarantined_until": r.until,
                "quarantined_until_iso": None if r.until is None else iso(r.until),
                "throttled": r.throttled,
                "absent_holders": r.absent_holders,
            }
            for r in (st.resources if snap.shown is None else snap.shown)
        ],
        "leases": [
            {
                "resource": i.resource,
                "owner": i.owner,
                "token": i.token,
                "granted_at": i.granted_at,
                "granted_at_iso": iso(i.granted_at),
                "expires_at": i.expires_at,
                "expires_at_iso": iso(i.expires_at),
                "held_seconds": round(now - i.granted_at, 3),
                "expires_in_seconds": round(i.expires_at - now, 3),
                "holder_present": i.holder_present,
                "tenant": i.tenant,
                **_holder_json(i, snap.client(i.client)),
            }
            for i in snap.leases
        ],
        "stalled_clients": [client_json(c, now) for c in snap.stalled],
        "stats": {
            "grants": snap.stats.grants,
            "timeouts": snap.stats.timeouts,
            "reclaimed": snap.stats.reclaimed,
            "revoked": snap.stats.revoked,
            "dropped_waiters": snap.stats.dropped_waiters,
            "quarantined_on_release": snap.stats.quarantined_on_release,
            "quarantined_by_operator": snap.stats.quarantined_by_operator,
            "wait_seconds_sum": snap.stats.wait_seconds_sum,
            "wait_seconds": [
                {"le": "+Inf" if b == float("inf") else b, "count": c}
                for b, c in snap.stats.wait_seconds
            ],
        },
    }


def _holder_json(info: LeaseInfo, client: ClientInfo | None) -> dict[str, Any]:
    return {
        "client": info.client,
        "presence": _presence_word(info.holder_present, client),
        "silent_seconds": None if client is None else client.silent_for,
        "stalled": client is not None and client.stalled,
    }


def client_json(client: ClientInfo, now: float) -> dict[str, Any]:
    """One client for scripts: its id, where it runs, its presence, silence,
    waiters and leases."""
    return {
        "id": client.id,
        "host": client.host,
        "pid": client.pid,
        "version": client.version,
        "joined_at": client.joined_at,
        "joined_at_iso": None if client.joined_at is None else iso(client.joined_at),
        "present": client.present,
        "presence": _presence_word(client.present, client),
        "silent_seconds": client.silent_for,
        "last_seen_iso": None if client.silent_for is None else iso(now - client.silent_for),
        "stalled": client.stalled,
        "waiters": client.waiters,
        "leases": client.leases,
    }


# -- leases and clients ------------------------------------------------------------


def _leases(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        snap = take(conn, args.pool)
    finally:
        conn.close()
    now = snap.status.server_time
    if args.json:
        rows = snapshot_json(snap)["leases"]
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(
        title=f"leases of pool {args.pool!r} on {snap.where}", title_justify="left", expand=False
    )
    named = any(info.tenant for info in snap.leases)
    for column in ("resource", "token", "owner", "client", "presence", "granted", "deadline"):
        table.add_column(column)
    if named:
        table.add_column("tenant")
    for info in snap.leases:
        client = snap.client(info.client)
        table.add_row(
            info.resource,
            str(info.token),
            info.owner,
            _where(info.client, client),
            holder_text(info, client),
            f"{ago(now - info.granted_at)} ago",
            f"in {ago(info.expires_at - now)}",
            *((info.tenant or "-",) if named else ()),
        )
    if not snap.leases:
        table.add_row("-", "", "nobody holds a lease", "", "", "", "")
    console().print(table)
    return 0


def _where(cid: str, client: ClientInfo | None) -> str:
    if client is None or not client.host:
        return cid
    return f"{cid} ({client.host}:{client.pid})"


def _clients(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        snap = take(conn, args.pool)
    finally:
        conn.close()
    now = snap.status.server_time
    if args.json:
        print(json.dumps([client_json(c, now) for c in snap.clients], indent=2))
        return 0
    table = Table(
        title=f"clients of pool {args.pool!r} on {snap.where}", title_justify="left", expand=False
    )
    for column in (
        "client",
        "host",
        "pid",
        "version",
        "presence",
        "last seen",
        "waiters",
        "leases",
    ):
        table.add_column(
            column, justify="right" if column in ("pid", "waiters", "leases") else "left"
        )
    for c in snap.clients:
        if c.stalled and c.silent_for is not None:
            presence = Text(f"stalled {ago(c.silent_for)}", style="bold yellow")
        else:
            presence = _HOLDER[c.present]
        table.add_row(
            c.id,
            c.host or "-",
            "-" if c.pid is None else str(c.pid),
            c.version or "-",
            presence,
            "-" if c.silent_for is None else f"{ago(c.silent_for)} ago",
            str(c.waiters),
            str(c.leases),
        )
    if not snap.clients:
        table.add_row("-", "", "", "", "no client waits or holds", "", "", "")
    console().print(table)
    return 0
