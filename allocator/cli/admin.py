"""``allocator extend``, ``remove``, ``quarantine``, ``revoke``, ``order``,
``weight``, ``delete`` and ``gc``: steering a pool from the shell."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

import attrs
from redis.exceptions import RedisError

from allocator._core.checks import MAX_WEIGHT, MIN_WEIGHT

from ._common import (
    CommandError,
    add_connection,
    ago,
    connect,
    describe,
    positive_float,
    positive_int,
)

__all__ = ["register"]


def register(commands: Any) -> None:
    extend = commands.add_parser(
        "extend", help="add resources to a pool (or update them: capacity, priority, rate)"
    )
    extend.add_argument("pool", help="the pool's name (made if new)")
    extend.add_argument("resources", nargs="+", metavar="RES", help="resource names")
    add_connection(extend)
    extend.add_argument("--capacity", type=int, default=1, help="leases at once (1)")
    extend.add_argument("--priority", type=float, default=0, help="higher is granted first (0)")
    extend.add_argument(
        "--rate", type=_rate, default=None, metavar="COUNT/SECONDS", help="e.g. 10/1.5"
    )
    extend.set_defaults(run=_extend)

    remove = commands.add_parser(
        "remove", help="take resources out (leased ones drain; --force revokes their leases)"
    )
    remove.add_argument("pool", help="the pool's name")
    remove.add_argument("resources", nargs="+", metavar="RES", help="resource names")
    add_connection(remove)
    remove.add_argument("--force", action="store_true", help="revoke their leases now")
    remove.set_defaults(run=_remove)

    quarantine = commands.add_parser(
        "quarantine",
        help="keep a resource out of rotation for a while (live leases stay), or end that early",
    )
    quarantine.add_argument("pool", help="the pool's name")
    quarantine.add_argument("resource", help="the resource's name")
    how = quarantine.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--for",
        dest="seconds",
        type=positive_float,
        metavar="SECONDS",
        help="how long it stays out (> 0); it comes back by itself when the time ends",
    )
    how.add_argument(
        "--end",
        action="store_true",
        help="end its quarantine now: it is free again at once and waiters are served",
    )
    add_connection(quarantine)
    quarantine.set_defaults(run=_quarantine)

    revoke = commands.add_parser(
        "revoke",
        help="end one lease now, named by its resource (and token): its holder is told "
        "(lost() turns true, LeaseLost at its next renew); the resource keeps its settings "
        "and goes to the next waiter",
    )
    revoke.add_argument("pool", help="the pool's name")
    revoke.add_argument("resource", help="the leased resource (as `allocator leases` shows it)")
    revoke.add_argument(
        "--token",
        type=positive_int,
        default=None,
        metavar="T",
        help="the lease's fencing token, where the resource holds several leases",
    )
    add_connection(revoke)
    revoke.set_defaults(run=_revoke)

    order = commands.add_parser(
        "order",
        help="set the pool's order: fifo (arrival order, the default) or tenant (fair "
        "shares between the tenants requests name; docs/concepts.md#tenants)",
    )
    order.add_argument("pool", help="the pool's name")
    order.add_argument("order", choices=("fifo", "tenant"), help="the order to serve in")
    add_connection(order)
    order.set_defaults(run=_order)

    weight = commands.add_parser(
        "weight",
        help="set a tenant's weight under the order tenant (0.01 to 100, default 1): "
        "its share of the grants while others wait too",
    )
    weight.add_argument("pool", help="the pool's name")
    weight.add_argument("tenant", help="the tenant's name ('' for requests that name none)")
    weight.add_argument("weight", type=_weight_value, help="its weight, 0.01 to 100")
    add_connection(weight)
    weight.set_defaults(run=_weight)

    delete = commands.add_parser("delete", help="delete a pool and every key it has")
    delete.add_argument("pool", help="the pool's name")
    add_connection(delete)
    delete.add_argument(
        "--force",
        action="store_true",
        help="even with live leases (holders get LeaseLost) or waiters (AcquireTimeout)",
    )
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(run=_delete)

    gc = commands.add_parser(
        "gc", help="reclaim expired leases, drop dead waiters (once, or every N s)"
    )
    gc.add_argument("pool", help="the pool's name")
    add_connection(gc)
    gc.add_argument(
        "--every",
        type=positive_float,
        metavar="SECONDS",
        help="run periodically until SIGTERM or Ctrl-C (> 0)",
    )
    gc.set_defaults(run=_gc)


def _weight_value(text: str) -> float:
    value = positive_float(text)
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise argparse.ArgumentTypeError(f"must be {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {text!r}")
    return value


def _rate(text: str) -> tuple[int, float]:
    count, slash, seconds = text.partition("/")
    try:
        pair = (int(count), float(seconds))
    except ValueError:
        pair = None
    if not slash or pair is None:
        raise argparse.ArgumentTypeError(f"rate must be COUNT/SECONDS, like 10/1.5: {text!r}")
    return pair


def _extend(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        added = conn.pool(args.pool).extend(
            args.resources, capacity=args.capacity, priority=args.priority, rate=args.rate
        )
    finally:
        conn.close()
    updated = len(set(args.resources)) - added
    print(f"pool {args.pool!r}: {added} added, {updated} updated")
    return 0


def _remove(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        pool = conn.existing(args.pool)
        done = pool.remove(args.resources, force=args.force)
    finally:
        conn.close()
    unknown = len(set(args.resources)) - done
    how = "removed (leases revoked)" if args.force else "removed or draining"
    print(f"pool {args.pool!r}: {done} {how}" + (f", {unknown} not in the pool" if unknown else ""))
    return 0


def _quarantine(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        pool = conn.existing(args.pool)
        try:
            if args.end:
                ended = pool.unquarantine(args.resource)
            else:
                pool.quarantine(args.resource, args.seconds)
        except KeyError:  # UnknownResource
            raise CommandError(f"pool {args.pool!r} has no resource {args.resource!r}") from None
    finally:
        conn.close()
    if not args.end:
        print(f"pool {args.pool!r}: {args.resource!r} quarantined for {ago(args.seconds)}")
    elif ended:
        print(f"pool {args.pool!r}: {args.resource!r} quarantine ended, back in rotation")
    else:
        print(f"pool {args.pool!r}: {args.resource!r} was not quarantined; nothing changed")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        ended = conn.existing(args.pool).revoke(args.resource, args.token)
    finally:
        conn.close()
    which = f"{args.resource!r}" + ("" if args.token is None else f" with token {args.token}")
    if not ended:
        raise CommandError(f"pool {args.pool!r} has no live lease on {which}")
    print(
        f"pool {args.pool!r}: lease on {which} revoked; its holder is told, and the "
        "resource goes to the next waiter"
    )
    return 0


def _order(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        conn.existing(args.pool).set_order(args.order)
    finally:
        conn.close()
    how = "arrival order" if args.order == "fifo" else "fair shares between tenants"
    print(f"pool {args.pool!r}: order {args.order} ({how}) from the next grant on")
    return 0


def _weight(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        try:
            conn.existing(args.pool).set_tenant_weight(args.tenant, args.weight)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    finally:
        conn.close()
    print(f"pool {args.pool!r}: tenant {args.tenant!r} has weight {args.weight:g}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    conn = connect(args)
    try:
        pool = conn.existing(args.pool)
        if not args.yes and sys.stdin.isatty():
            status = pool.status()
            answer = input(
                f"delete pool {args.pool!r} on {conn.shown} ({status.size} resources, "
                f"{status.leased} leased, {status.waiting} waiting)? [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        pool.delete(force=args.force)
    finally:
        conn.close()
    print(f"pool {args.pool!r} deleted")
    return 0


def _gc(args: argparse.Namespace) -> int:
    conn = connect(args)
    pool = conn.existing(args.pool) if args.every is None else conn.pool(args.pool)
    stop = threading.Event()
    if args.every is not None and threading.current_thread() is threading.main_thread():
        # A clean stop on SIGTERM/SIGINT: finish the current run, then exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        while True:
            try:
                report = pool.gc()
            except RedisError as exc:
                if args.every is None:
                    raise
                # A periodic job outlives a server restart: report, try next time.
                print(f"allocator gc: {describe(exc, conn.shown)}", file=sys.stderr, flush=True)
            else:
                print(json.dumps({"pool": args.pool, **attrs.asdict(report)}), flush=True)
            if args.every is None or stop.wait(args.every):
                return 0
    finally:
        conn.close()
