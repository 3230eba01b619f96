"""``allocator metrics``: serve the pools' metrics on ``/metrics`` for
Prometheus (the collector is :class:`allocator.metrics.AllocatorCollector`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from allocator.metrics import AllocatorCollector

from ._common import CommandError, Connection, add_connection, connect

__all__ = ["make_metrics_server", "register"]


def register(commands: Any) -> None:
    metrics = commands.add_parser("metrics", help="serve Prometheus metrics of pools on /metrics")
    metrics.add_argument("pools", nargs="*", metavar="POOL", help="the pools to export")
    add_connection(metrics)
    metrics.add_argument(
        "--all",
        action="store_true",
        help="every pool under the prefix, listed again at each scrape",
    )
    metrics.add_argument("--port", type=int, default=9464, help="port (9464; 0: any free one)")
    metrics.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    metrics.set_defaults(run=_metrics)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def make_metrics_server(
    conn: Connection, names: list[str], all_pools: bool, host: str, port: int
) -> WSGIServer:
    """A WSGI server whose ``/metrics`` shows the pools (not yet serving)."""
    if all_pools:
        collector = AllocatorCollector(client=conn.client, prefix=conn.prefix)
    else:
        collector = AllocatorCollector([conn.pool(name) for name in names])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app = make_wsgi_app(registry)
    try:
        return make_server(host, port, app, handler_class=_Quiet)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _metrics(args: argparse.Namespace) -> int:
    if not args.pools and not args.all:
        raise CommandError("name the pools to export, or give --all")
    if args.pools and args.all:
        raise CommandError("give either pool names or --all, not both")
    conn = connect(args)
    try:
        for name in args.pools:
            conn.existing(name)
        server = make_metrics_server(conn, args.pools, args.all, args.host, args.port)
        host, port = str(server.server_address[0]), int(server.server_address[1])
        what = "every pool" if args.all else ", ".join(repr(n) for n in args.pools)
        print(
            f"allocator metrics: {what} (prefix {conn.prefix!r}) on {conn.shown}, "
            f"serving http://{host}:{port}/metrics",
            file=sys.stderr,
            flush=True,
        )
        with server:
            server.serve_forever()
    finally:
        conn.close()
    return 0
