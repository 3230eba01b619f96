"""``allocator metrics``: serve the pools' metrics on ``/metrics`` for
Prometheus (the collector is :class:`allocator.metrics.AllocatorCollector`)."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import IO, Any, cast
from wsgiref.handlers import SimpleHandler
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import CollectorRegistry, make_wsgi_app

from allocator.metrics import DEFAULT_PER_RESOURCE_LIMIT, DEFAULT_TENANT_LIMIT, AllocatorCollector

from ._common import (
    CommandError,
    Connection,
    UsageError,
    add_connection,
    connect,
    describe,
    log_to_stderr,
    port,
    positive_float,
    prefix_of,
    safe_url,
    sigterm_ends,
    url_of,
    whole,
)

__all__ = ["DEFAULT_INTERVAL", "make_metrics_server", "register"]

_log = logging.getLogger("allocator")

#: Seconds between two background readings of the pools.
DEFAULT_INTERVAL = 2.0


def register(commands: Any) -> None:
    metrics = commands.add_parser("metrics", help="serve Prometheus metrics of pools on /metrics")
    metrics.add_argument(
        "pools",
        nargs="*",
        metavar="POOL",
        help="the pools to export (one not made yet is allocator_up 0 until it is)",
    )
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
    metrics.add_argument(
        "--tenant-limit",
        type=_limit,
        default=DEFAULT_TENANT_LIMIT,
        metavar="N",
        help="at most N tenants a pool get series of their own (allocator_tenant_*): "
        'those with the most grants; the others are summed under tenant="(other)" '
        f"({DEFAULT_TENANT_LIMIT}; 0: no limit)",
    )
    metrics.add_argument(
        "--interval",
        type=positive_float,
        default=DEFAULT_INTERVAL,
        metavar="S",
        help=f"seconds between readings of the pools, made in the background: a scrape "
        f"serves the last one at once ({DEFAULT_INTERVAL:g}); a pool read more than "
        "3 intervals + 2 s ago is allocator_up 0",
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
            self.rfile, stdout, self.get_stderr(), self.get_environ(), multithread=True
        )
        app = cast(WSGIServer, self.server).get_app()
        assert app is not None  # make_server gave it
        handler.run(app)


class _Server(ThreadingMixIn, WSGIServer):
    """One thread a request: a scrape never waits for another."""

    daemon_threads = True
    block_on_close = False


class _Exporter:
    """What ``/metrics`` serves: the pools' :class:`AllocatorCollector`,
    reading in the background, once Redis could be reached. Until then
    (Redis down when the exporter started), ``allocator_up 0`` for each pool
    named (and for the listing, with ``--all``), while a thread connects
    again every interval; the deploy order of the exporter and Redis is
    nobody's to choose."""

    def __init__(
        self,
        make: Callable[[Connection], AllocatorCollector],
        connect_again: Callable[[], Connection] | None,
        conn: Connection | None,
        names: list[str],
        interval: float,
    ) -> None:
        self._make = make
        self._names = names
        self._interval = interval
        self._stop = threading.Event()
        self.conn = conn
        self.inner = None if conn is None else make(conn)
        self._thread: threading.Thread | None = None
        if conn is None and connect_again is not None:
            self._thread = threading.Thread(
                target=self._connect,
                args=(connect_again,),
                name="allocator-metrics-connect",
                daemon=True,
            )
            self._thread.start()

    def _connect(self, connect_again: Callable[[], Connection]) -> None:
        while not self._stop.wait(self._interval):
            try:
                conn = connect_again()
            except Exception:
                continue
            if self._stop.is_set():
                conn.close()
                return
            self.conn, self.inner = conn, self._make(conn)
            _log.info("allocator metrics: reached Redis at %s", conn.shown)
            return

    def close(self) -> None:
        self._stop.set()
        if self.inner is not None:
            self.inner.close()
        if self.conn is not None:
            self.conn.close()

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        inner = self.inner
        if inner is not None:
            yield from inner.collect()
            return
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "allocator_up",
            "1 if the pool was read in this scrape, 0 if not (server down or refusing); "
            "without a pool label: whether the pools could be listed.",
            labels=["pool"],
        )
        for name in self._names or [""]:
            up.add_metric([name], 0)
        yield up


def make_metrics_server(
    conn: Connection | None,
    names: list[str],
    all_pools: bool,
    host: str,
    port: int,
    *,
    per_resource: bool = True,
    per_resource_limit: int | None = DEFAULT_PER_RESOURCE_LIMIT,
    tenant_limit: int | None = DEFAULT_TENANT_LIMIT,
    interval: float = DEFAULT_INTERVAL,
    connect_again: Callable[[], Connection] | None = None,
) -> tuple[WSGIServer, _Exporter]:
    """A threaded WSGI server whose ``/metrics`` shows the pools (not yet
    serving), and its collector (to close). ``conn`` None: Redis could not
    be reached yet; ``connect_again`` is tried every ``interval``."""

    def make(conn: Connection) -> AllocatorCollector:
        options: dict[str, Any] = {
            "per_resource": per_resource,
            "per_resource_limit": per_resource_limit,
            "tenant_limit": tenant_limit,
            "interval": interval,
        }
        if all_pools:
            return AllocatorCollector(client=conn.client, prefix=conn.prefix, **options)
        return AllocatorCollector([conn.pool(name) for name in names], **options)

    exporter = _Exporter(make, connect_again, conn, [] if all_pools else names, interval)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    app = make_wsgi_app(registry)
    try:
        server = make_server(host, port, app, server_class=_Server, handler_class=_RequestHandler)
    except OSError as exc:
        exporter.close()
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return server, exporter


def _metrics(args: argparse.Namespace) -> int:
    if not args.pools and not args.all:
        raise UsageError("name the pools to export, or give --all")
    if args.pools and args.all:
        raise UsageError("give either pool names or --all, not both")
    conn: Connection | None
    with log_to_stderr():
        try:
            conn = connect(args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis down at the start: serve allocator_up 0 until it is up.
            _log.warning(
                "allocator metrics: %s; reported as allocator_up 0 until it can be reached",
                describe(exc, safe_url(url_of(args))),
            )
            conn = None
        server, exporter = make_metrics_server(
            conn,
            args.pools,
            args.all,
            args.host,
            args.port,
            per_resource=args.per_resource,
            per_resource_limit=args.per_resource_limit or None,
            tenant_limit=args.tenant_limit or None,
            interval=args.interval,
            connect_again=lambda: connect(args),
        )
        try:
            # The first reading, if it comes soon, so that the first scrape
            # shows it; a server that does not answer is not waited for.
            if exporter.inner is not None:
                exporter.inner.wait_first_reading(1.0)
            host, port = str(server.server_address[0]), int(server.server_address[1])
            what = "every pool" if args.all else ", ".join(repr(n) for n in args.pools)
            # SIGTERM (a service manager's stop) ends the serving with exit 0,
            # from the moment the line below says it serves; an outage of the
            # server is logged as one line, not a traceback.
            with server, sigterm_ends():
                print(
                    f"allocator metrics: {what} (prefix {prefix_of(args)!r}) on "
                    f"{safe_url(url_of(args))}, serving http://{host}:{port}/metrics",
                    file=sys.stderr,
                    flush=True,
                )
                server.serve_forever()
        finally:
            exporter.close()
    return 0
