"""The ``allocator`` command: ``demo``, ``bench``, ``gc`` and ``status``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from typing import Any

import attrs

__all__ = ["main"]


def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _gc(args: argparse.Namespace) -> int:
    import redis

    from . import FairAllocator

    pool = FairAllocator(_client(args.url), args.pool, prefix=args.prefix)
    stop = threading.Event()
    if args.every is not None:
        # A clean stop on SIGTERM/SIGINT: finish the current run, then exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while True:
        try:
            report = pool.gc()
        except redis.RedisError as exc:
            if args.every is None:
                raise
            # A periodic job outlives a server restart: report, try next time.
            print(f"allocator gc: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        else:
            print(json.dumps({"pool": args.pool, **attrs.asdict(report)}), flush=True)
        if args.every is None or stop.wait(args.every):
            return 0


def _status(args: argparse.Namespace) -> int:
    from . import FairAllocator

    status = FairAllocator(_client(args.url), args.pool, prefix=args.prefix).status()
    print(json.dumps(attrs.asdict(status), indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocator", description="A FIFO-fair pool of named resources on Redis."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="watch workers share a small pool in arrival order")
    importlib.import_module("allocator._demo").add_arguments(demo)

    bench = commands.add_parser(
        "bench", help="measure latency, fairness and cost against baselines"
    )
    importlib.import_module("allocator._bench").add_arguments(bench)

    for name, text in (("gc", "collect garbage in a pool (once, or every N s)"),
                       ("status", "print a pool's status as JSON")):  # fmt: skip
        sub = commands.add_parser(name, help=text)
        sub.add_argument("pool", help="the pool's name")
        sub.add_argument(
            "--url",
            default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            help="Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379/0)",
        )
        sub.add_argument("--prefix", default="alloc", help="key prefix (default: alloc)")
    gc = commands.choices["gc"]
    gc.add_argument("--every", type=float, metavar="SECONDS", help="run periodically until SIGTERM")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return int(importlib.import_module("allocator._demo").run(args))
    if args.command == "bench":
        return int(importlib.import_module("allocator._bench").run(args))
    return _gc(args) if args.command == "gc" else _status(args)


if __name__ == "__main__":
    sys.exit(main())
