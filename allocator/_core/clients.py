"""Who the clients of a pool are, as its views show them (``clients()``,
``leases``, ``status``): what a client says of itself when it joins a pool,
and when a connected client counts as *stalled* (docs/operations.md).

A waiting client's reader refreshes its liveness mark every heartbeat
(:func:`~.presence.heartbeat_of`: 2 s for a client that keeps a presence,
1 s for one judged by its mark alone); the mark's score is the time of the last
refresh plus the mark's length (:func:`~.presence.alive_ms`), so the
client's silence is the server's time minus that refresh. A client that is
connected (its presence connection is open) and waits, yet has been silent
for longer than its heartbeat plus :data:`STALL_MARGIN`, is stopped (SIGSTOP), paused (a long
GC) or blocked (an event loop that does not yield): connected, but not
going on."""

from __future__ import annotations

import os
import socket
from typing import Any

from .._values import ClientInfo
from .._version import __version__
from .presence import alive_ms, heartbeat_of

#: What a heartbeat may be late by without the client looking stalled: a
#: round trip to a slow server, a reader's short backoff.
STALL_MARGIN = 1.0


def stalled_after(cid: str) -> float:
    """Silence past which client ``cid``, connected and waiting, counts as
    stalled: its heartbeat, and the margin."""
    return heartbeat_of(cid) + STALL_MARGIN


def client_info() -> str:
    """What a client says of itself on its first acquire in a pool
    (``<pid>|<version>|<host>``, lua/acquire.lua)."""
    host = socket.gethostname()[:255] or "?"
    return f"{os.getpid()}|{__version__}|{host}"


def silence(cid: str, mark_ms: int, now_ms: int) -> float:
    """Seconds since client ``cid``'s last heartbeat, from its liveness
    mark (``mark_ms``: the score in ``alive``) at server time ``now_ms``."""
    return max(now_ms - (mark_ms - alive_ms(cid)), 0) / 1000


def stalled(cid: str, present: bool | None, waiters: int, silent_for: float | None) -> bool:
    """Whether client ``cid`` is stalled: connected, waiting (so due a
    heartbeat), and silent past :func:`stalled_after`."""
    return (
        bool(present) and waiters > 0 and silent_for is not None and silent_for > stalled_after(cid)
    )


def clients_of(rows: list[tuple[str, str, str, int, str]], now_ms: int) -> tuple[ClientInfo, ...]:
    """The clients of a pool from the rows of lua/clients.lua (``kind``,
    client id, liveness mark or '', presence 1/0/-1, info or ''), read at
    server time ``now_ms``: one per client, sorted by host, pid and id. A
    client met on several pages takes what its last row said."""
    seen: dict[str, dict[str, Any]] = {}
    for kind, cid, mark, present, info in rows:
        row = seen.setdefault(cid, {"waiters": 0, "leases": 0})
        row.update(mark=mark, present=None if present < 0 else present == 1, info=info)
        if kind == "w":
            row["waiters"] += 1
        elif kind == "l":
            row["leases"] += 1
    out = []
    for cid, row in seen.items():
        host = pid = version = joined = None
        parts = row["info"].split("|", 3) if row["info"] else []
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            joined, pid, version, host = int(parts[0]) / 1000, int(parts[1]), parts[2], parts[3]
        mark = row["mark"]
        silent = silence(cid, int(float(mark)), now_ms) if mark else None
        out.append(
            ClientInfo(
                id=cid,
                host=host,
                pid=pid,
                version=version,
                joined_at=joined,
                present=row["present"],
                silent_for=silent,
                waiters=row["waiters"],
                leases=row["leases"],
                stalled=stalled(cid, row["present"], row["waiters"], silent),
            )
        )
    out.sort(key=lambda c: (c.host or "~", c.pid or 0, c.id))
    return tuple(out)
