"""``allocator events``: a pool's event log (grants, releases, expiries,
reclaims, revocations, quarantines, dropped waiters), read with ``XREVRANGE``
and, with ``--follow``, ``XREAD BLOCK``: a read-only user may read it.
``--enable N`` and ``--disable`` switch it (``set_events``, a write)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._common import (
    UsageError,
    add_connection,
    connect,
    iso,
    non_empty,
    positive_int,
    sigterm_ends,
    whole,
)

__all__ = ["register"]

#: The kinds of event the scripts log (lua/prelude_queue.lua, P:event).
EVENT_KINDS = ("grant", "release", "expire", "reclaim", "revoke", "quarantine", "drop")

#: Entries read at a time (XREVRANGE COUNT, XREAD COUNT).
PAGE = 500


def register(commands: Any) -> None:
    events = commands.add_parser(
        "events",
        help="a pool's event log: grants, releases, expiries, reclaims, revocations, "
        "quarantines, dropped waiters (--enable N to keep one)",
    )
    events.add_argument("pool", help="the pool's name")
    add_connection(events)
    events.add_argument(
        "--resource", type=non_empty, default=None, metavar="R", help="only the events of R"
    )
    events.add_argument(
        "--kind",
        choices=EVENT_KINDS,
        action="append",
        default=None,
        help="only events of this kind (may be given again)",
    )
    events.add_argument(
        "--count",
        type=positive_int,
        default=20,
        metavar="N",
        help="show the last N events that match (20)",
    )
    events.add_argument(
        "--follow", "-f", action="store_true", help="then wait for new ones (Ctrl-C to stop)"
    )
    events.add_argument("--json", action="store_true", help="one JSON object a line")
    switch = events.add_mutually_exclusive_group()
    switch.add_argument(
        "--enable",
        type=whole(1, 10_000_000),
        default=None,
        metavar="N",
        help="keep the pool's log, about its N latest events (a write: set_events)",
    )
    switch.add_argument(
        "--disable", action="store_true", help="stop logging (what was written stays)"
    )
    events.set_defaults(run=_events)


def _events(args: argparse.Namespace) -> int:
    switching = args.enable is not None or args.disable
    if switching and (args.follow or args.resource or args.kind or args.json):
        raise UsageError("--enable and --disable take no reading options")
    conn = connect(args)
    try:
        pool = conn.existing(args.pool)
        if switching:
            pool.set_events(None if args.disable else args.enable)
            state = "off" if args.disable else f"on, keeping about {args.enable} events"
            print(f"event log of pool {args.pool!r}: {state}")
            return 0
        key = pool.events_key
        meta = key[: -len("events")] + "meta"
        on = conn.client.hget(meta, "ev") is not None
        if not on:
            print(
                f"allocator events: the event log of pool {args.pool!r} is off "
                f"(allocator events {args.pool} --enable N)",
                file=sys.stderr,
                flush=True,
            )
        last = _show(_latest(conn.client, key, args), args)
        if not args.follow:
            return 0
        with sigterm_ends():
            while True:
                got = conn.client.xread({key: last}, count=PAGE, block=1000)
                for _, entries in got or []:
                    for entry in entries:
                        last = _text(entry[0])
                        if _match(entry[1], args):
                            _print(entry, args)
    finally:
        conn.close()


def _latest(client: Any, key: str, args: argparse.Namespace) -> list[Any]:
    """The last ``--count`` entries that match, oldest first (read back from
    the end a page at a time: the log is capped, so this ends)."""
    found: list[Any] = []
    top = "+"
    while len(found) < args.count:
        page = client.xrevrange(key, max=top, min="-", count=PAGE)
        if not page:
            break
        found.extend(e for e in page if _match(e[1], args))
        top = "(" + _text(page[-1][0])
        if len(page) < PAGE:
            break
    return found[: args.count][::-1]


def _show(entries: list[Any], args: argparse.Namespace) -> str:
    """Print the entries; the id to follow from (``$``: the newest)."""
    for entry in entries:
        _print(entry, args)
    return _text(entries[-1][0]) if entries else "$"


def _match(fields: dict[Any, Any], args: argparse.Namespace) -> bool:
    f = _fields(fields)
    if args.resource is not None and f.get("resource") != args.resource:
        return False
    return not args.kind or f.get("kind") in args.kind


def _fields(fields: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in fields.items()}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _print(entry: Any, args: argparse.Namespace) -> None:
    entry_id, fields = _text(entry[0]), _fields(entry[1])
    at = int(entry_id.split("-")[0]) / 1000
    if args.json:
        row: dict[str, Any] = {"id": entry_id, "time": at, "time_iso": iso(at), **fields}
        if row.get("token"):
            row["token"] = int(row["token"])
        print(json.dumps(row), flush=True)
        return
    parts = [iso(at), f"{fields.get('kind', '?'):<10}", fields.get("resource") or "-"]
    for name in ("token", "client", "owner"):
        if fields.get(name):
            parts.append(f"{name} {fields[name]}")
    print("  ".join(parts), flush=True)
