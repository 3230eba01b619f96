"""Fetch pages through a pool of proxies; a broken proxy is quarantined.

    python examples/proxy_pool.py                                  # in-process fakeredis
    python examples/proxy_pool.py --url redis://localhost:6379/0   # a real server

The example starts, on 127.0.0.1, a small web site and three forward proxies in
front of it. One proxy is broken: it answers every request with 502 Bad
Gateway. Worker threads fetch the site's pages, each through a proxy leased
from the pool. A fetch that fails releases its proxy with
``quarantine=seconds``, which keeps the proxy out of rotation for that long,
and the page is tried again through another proxy. When the quarantine ends
the proxy is back in rotation, fails again, and goes back into quarantine.
"""

from __future__ import annotations

import argparse
import http.client
import queue
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import redis

from allocator import FairAllocator


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


# -- the local network: a web site and forward proxies -------------------------------------


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log on the console

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Site(Quiet):
    """The origin server: ``/page/N`` is a small page that takes a moment to make."""

    delay = 0.01

    def do_GET(self) -> None:
        time.sleep(self.delay)
        self.reply(200, f"<h1>{self.path}</h1>".encode())


class Proxy(Quiet):
    """A forward proxy: the request line holds the absolute URL to fetch."""

    broken = False

    def do_GET(self) -> None:
        if self.broken:
            self.reply(502, b"bad gateway")
            return
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=5)
        try:
            upstream.request("GET", target.path)
            answer = upstream.getresponse()
            self.reply(answer.status, answer.read())
        finally:
            upstream.close()


class BrokenProxy(Proxy):
    broken = True


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FetchError(Exception):
    pass


def fetch(proxy: str, url: str) -> bytes:
    """GET ``url`` through the forward proxy ``proxy``."""
    where = urlsplit(proxy)
    conn = http.client.HTTPConnection(where.hostname or "", where.port or 80, timeout=5)
    try:
        conn.request("GET", url)  # an absolute URL: that is how one talks to a proxy
        answer = conn.getresponse()
        body = answer.read()
    except (OSError, http.client.HTTPException) as exc:
        raise FetchError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if answer.status != 200:
        raise FetchError(f"{answer.status} {answer.reason}")
    return body


# -- the workers ----------------------------------------------------------------------------


class Log:
    """Counts fetches per proxy and prints events, from many threads."""

    def __init__(self, names: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self.names = names
        self.start = time.monotonic()
        self.pages: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.errors: list[BaseException] = []

    def event(self, text: str) -> None:
        with self.lock:
            print(f"  +{time.monotonic() - self.start:5.2f} s  {text}", flush=True)


def worker(
    pool: FairAllocator, pages: queue.Queue[str], log: Log, quarantine: float, go: threading.Barrier
) -> None:
    try:
        go.wait()
        while True:
            try:
                url = pages.get_nowait()
            except queue.Empty:
                return
            while True:  # until a proxy gets the page
                lease = pool.acquire(timeout=30)
                failed: FetchError | None = None
                try:
                    body = fetch(lease.resource, url)
                except FetchError as exc:
                    failed = exc
                finally:
                    # A bad proxy stays out of rotation for a while; the others
                    # go straight back to the next waiter.
                    pool.release(lease, quarantine=quarantine if failed else None)
                name = log.names[lease.resource]
                if failed is None:
                    assert urlsplit(url).path.encode() in body, (url, body)
                    with log.lock:
                        log.pages[lease.resource] += 1
                    break
                with log.lock:
                    log.failures[lease.resource] += 1
                row = next(r for r in pool.status().resources if r.name == lease.resource)
                log.event(
                    f"{name} failed ({failed}) on {urlsplit(url).path}: "
                    f"quarantined for {quarantine:g} s, status says {row.state!r}"
                )
    except Exception as exc:  # re-raised by main: a thread has nobody to raise to
        with log.lock:
            log.errors.append(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--workers", type=int, default=4, help="fetching threads (4)")
    parser.add_argument("--pages", type=int, default=40, help="pages to fetch (40)")
    parser.add_argument(
        "--quarantine", type=float, default=0.25, help="seconds a failed proxy sits out (0.25)"
    )
    args = parser.parse_args(argv)

    site = serve(Site)
    proxies = [serve(Proxy), serve(Proxy), serve(BrokenProxy)]
    urls = {f"http://127.0.0.1:{p.server_port}": p for p in proxies}
    names = {url: f"proxy-{i + 1}" for i, url in enumerate(urls)}
    broken = {url for url, p in urls.items() if p.RequestHandlerClass is BrokenProxy}

    pool = FairAllocator(connect(args.url), f"proxies-{uuid.uuid4().hex[:8]}", lease_ttl=30)
    pool.extend(urls)
    print(f"{len(urls)} proxies in front of http://127.0.0.1:{site.server_port}/:")
    for url, name in names.items():
        print(f"  {name}  {url}{'  (broken: answers 502)' if url in broken else ''}")

    pages: queue.Queue[str] = queue.Queue()
    for n in range(args.pages):
        pages.put(f"http://127.0.0.1:{site.server_port}/page/{n}")
    log = Log(names)
    go = threading.Barrier(args.workers)
    threads = [
        threading.Thread(target=worker, args=(pool, pages, log, args.quarantine, go), daemon=True)
        for _ in range(args.workers)
    ]
    print(f"{args.workers} workers fetch {args.pages} pages:")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - log.start
    for server in [site, *proxies]:
        server.shutdown()
        server.server_close()
    if log.errors:
        raise log.errors[0]

    fetched = sum(log.pages.values())
    print(f"fetched {fetched} of {args.pages} pages in {elapsed:.2f} s:")
    for url, name in names.items():
        print(
            f"  {name}  {log.pages[url]:3d} pages  {log.failures[url]:2d} failures"
            f"{'  (broken)' if url in broken else ''}"
        )
    return 0 if fetched == args.pages else 1


if __name__ == "__main__":
    sys.exit(main())
