"""``allocator metrics``: serve the pools' metrics on ``/metrics`` for
Prometheus (the collector is :class:`allocator.metrics.AllocatorCollector`)."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any, cast
from wsgiref.handlers import SimpleHandler
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from allocator.metrics import DEFAULT_PER_RESOURCE_LIMIT, AllocatorCollector

from ._common import (
    CommandError,
    Connection,
    UsageError,
    add_connection,
    connect,
    log_to_stderr,
    port,
    sigterm_ends,
    whole,
)

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
    metrics.add_argument(
        "--port", type=port, default=9464, help="port, 0 to 65535 (9464; 0: any free one)"
    )
    metrics.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    metrics.add_argument(
        "--no-per-resource",
        dest="per_resource",
        action="store_false",
        help="leave out the per-resource series (allocator_resource_state, "
        "allocator_resource_leases: five series a resource)",
    )
    metrics.add_argument(
        "--per-resource-limit",
        type=_limit,
        default=DEFAULT_PER_RESOURCE_LIMIT,
        metavar="N",
        help="a pool of more than N resources gets no per-resource series, and a warning "
        f"once ({DEFAULT_PER_RESOURCE_LIMIT}; 0: no limit)",
    )
    metrics.set_defaults(run=_metrics)


_limit = whole(0)


class _Handler(ServerHandler):
    """wsgiref's handler of one request, except that what is not an error
    (:class:`Terminated` from SIGTERM, KeyboardInterrupt from Ctrl-C) ends
    the serving. wsgiref's ``run()`` catches everything with a bare
    ``except`` and hands it to ``handle_error``, which logs a traceback and
    answers 500: a SIGTERM that came during a scrape, or while its reply
    was being written, was lost, and the exporter served on."""

    def handle_error(self) -> None:
        error = sys.exc_info()[1]
        if error is not None and not isinstance(error, Exception):
            raise error
        super().handle_error()

    def close(self) -> None:
        # Without ServerHandler's access log, which also fails (AttributeError)
        # on a request ended before it had a status, and would take the place
        # of the Terminated being raised.
        SimpleHandler.close(self)


class _RequestHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        # WSGIRequestHandler.handle (the same in Python 3.11 to 3.13), with
        # _Handler in place of ServerHandler, which it does not let us choose.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = ""
            self.request_version = ""
            self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        stdout = cast("IO[bytes]", self.wfile)
        handler = _Handler(
            self.rfile, stdout, self.get_stderr(), self.get_environ(), multithread=False
        )
        app = cast(WSGIServer, self.server).get_app()
        assert app is not None  # make_server gave it
        handler.run(app)


def make_metrics_server(
    conn: Connection,
    names: list[str],
    all_pools: bool,
    host: str,
    port: int,
    *,
    per_resource: bool = True,
    per_resource_limit: int | None = DEFAULT_PER_RESOURCE_LIMIT,
) -> WSGIServer:
    """A WSGI server whose ``/metrics`` shows the pools (not yet serving)."""
    options: dict[str, Any] = {
        "per_resource": per_resource,
        "per_resource_limit": per_resource_limit,
    }
    if all_pools:
        collector = AllocatorCollector(client=conn.client, prefix=conn.prefix, **options)
    else:
        collector = AllocatorCollector([conn.pool(name) for name in names], **options)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app = make_wsgi_app(registry)
    try:
        return make_server(host, port, app, handler_class=_RequestHandler)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _metrics(args: argparse.Namespace) -> int:
    if not args.pools and not args.all:
        raise UsageError("name the pools to export, or give --all")
    if args.pools and args.all:
        raise UsageError("give either pool names or --all, not both")
    conn = connect(args)
    try:
        for name in args.pools:
            conn.existing(name)
        server = make_metrics_server(
            conn,
            args.pools,
            args.all,
            args.host,
            args.port,
            per_resource=args.per_resource,
            per_resource_limit=args.per_resource_limit or None,
        )
        host, port = str(server.server_address[0]), int(server.server_address[1])
        what = "every pool" if args.all else ", ".join(repr(n) for n in args.pools)
        # SIGTERM (a service manager's stop) ends the serving with exit 0,
        # from the moment the line below says it serves; an outage of the
        # server is logged as one line, not a traceback.
        with server, sigterm_ends(), log_to_stderr():
            print(
                f"allocator metrics: {what} (prefix {conn.prefix!r}) on {conn.shown}, "
                f"serving http://{host}:{port}/metrics",
                file=sys.stderr,
                flush=True,
            )
            server.serve_forever()
    finally:
        conn.close()
    return 0
