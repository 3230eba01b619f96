"""Errors that tell the truth (docs/api.md#errors): how a call fails its caller.

Each test runs against a real server (the session's, or a private one of
its own that it stops, restarts or configures) and checks one way a call
used to fail badly: spinning for ever, retrying a misconfiguration,
escaping internals, stacking redis-py's retries under the library's.
No timing assertions: a call that must end is run in a thread whose join
has a generous guard, and retry bounds are counted, not timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import random
from collections.abc import Iterator
from typing import Any

import _servers
import attrs
import pytest
import redis
import redis.asyncio
from helpers import Background, LoopThread, wait_until
from redis.backoff import AbstractBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, Lease
from allocator._core.steps import Sleep
from allocator._scripts import FUNCTIONS, SCRIPTS, scripts
from allocator._server import RedisServer

pytestmark = pytest.mark.real_redis

CTX = multiprocessing.get_context("spawn")
#: allocator._core.checks.MAX_SECONDS: the longest timeout (ten years).
MAX_SECONDS = 10 * 365 * 24 * 3600.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private server of the test's own, to stop and start at will."""
    with RedisServer() as made:
        yield made


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def stopped_pool(server: RedisServer, name: str, **kwargs: Any) -> tuple[Any, FairAllocator]:
    """A pool that worked, on a server that is now gone (its port closed)."""
    made = redis.Redis.from_url(server.url, **kwargs)
    pool = FairAllocator(made, name)
    pool.extend(["r"])
    server.stop()
    return made, pool


# -- 1. a non-blocking acquire is bounded --------------------------------------------


def test_nonblocking_acquire_gives_up_when_redis_is_gone(
    server: RedisServer, pool_name: str
) -> None:
    _client, pool = stopped_pool(server, pool_name)
    call = Background(lambda: pool.acquire(blocking=False))
    with pytest.raises(RedisConnectionError):
        call.join(60)  # before the fix: retried for ever, the join guard fails


# -- 2. permanent errors are raised at once; retries are logged ---------------------


def test_wrong_password_is_raised_at_once_not_retried(pool_name: str) -> None:
    with RedisServer() as locked:
        redis.Redis.from_url(locked.url).config_set("requirepass", "right")
        good = redis.Redis.from_url(locked.url, password="right")
        FairAllocator(good, pool_name).extend(["r"])
        bad = FairAllocator(redis.Redis.from_url(locked.url, password="wrong"), pool_name)
        # No timeout: before the fix this spun for ever, nothing logged.
        call = Background(lambda: bad.acquire())
        with pytest.raises(AuthenticationError):
            call.join(60)
        with pytest.raises(AuthenticationError):
            Background(lambda: bad.acquire(timeout=3600)).join(60)
        good.close()


def test_acl_refusal_is_raised_at_once(pool_name: str, redis_url: str) -> None:
    with RedisServer() as own:
        admin = redis.Redis.from_url(own.url)
        # Redis 6.2 has no FCALL (nor a rule for it): refusing EVALSHA is enough there.
        refused = ["-evalsha"] if _servers.lacks("functions") else ["-evalsha", "-fcall"]
        admin.execute_command("ACL", "SETUSER", "nobody", "on", ">pw", "~*", "+@all", *refused)
        user = redis.Redis.from_url(own.url, username="nobody", password="pw")
        with pytest.raises(redis.exceptions.NoPermissionError):
            Background(lambda: FairAllocator(user, pool_name).acquire()).join(60)
        admin.close()


def test_tls_failures_and_auth_errors_are_permanent() -> None:
    import ssl

    from allocator._core.retry import is_transient

    try:
        raise ssl.SSLCertVerificationError(1, "certificate verify failed")
    except ssl.SSLError as tls:
        try:
            raise RedisConnectionError("Error 1 connecting to x:6380. certificate") from tls
        except RedisConnectionError as wrapped:
            assert not is_transient(wrapped)
    assert not is_transient(AuthenticationError("invalid username-password pair"))
    assert not is_transient(redis.exceptions.AuthorizationError("nope"))
    assert not is_transient(RedisConnectionError("WRONGPASS invalid username-password pair"))
    assert is_transient(RedisConnectionError("Error 111 connecting to 127.0.0.1:1"))
    assert is_transient(redis.exceptions.TimeoutError("Timeout reading from socket"))
    assert is_transient(redis.exceptions.ReadOnlyError("READONLY"))
    assert not is_transient(redis.exceptions.ResponseError("ERR bad"))
    assert not is_transient(ValueError())


def test_retries_log_at_debug_and_a_long_outage_warns_once(
    server: RedisServer, pool_name: str, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    _client, pool = stopped_pool(server, pool_name)
    monkeypatch.setattr("allocator._core.retry.OUTAGE_WARNING", 0.3)
    with caplog.at_level(logging.DEBUG, logger="allocator"):
        with pytest.raises(AcquireTimeout) as timed_out:
            pool.acquire(timeout=2.0)
    assert isinstance(timed_out.value.__cause__, RedisConnectionError)
    mine = [r for r in caplog.records if r.name == "allocator"]
    debug = [r for r in mine if r.levelno == logging.DEBUG and "retry" in r.getMessage()]
    warnings = [r for r in mine if r.levelno == logging.WARNING]
    assert debug, "each retry is logged at debug"
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unreachable" in warnings[0].getMessage()


# -- 3. a give-up chains its cause; a reader never spins on a refusal -----------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_server_that_dies_under_a_waiter_is_the_cause_of_its_timeout(
    server: RedisServer, pool_name: str, flavour: str
) -> None:
    """A waiter whose server dies while it waits (its reader is failing,
    nothing else calls) times out with the transport error as the cause,
    not a bare AcquireTimeout that hides it."""
    admin = redis.Redis.from_url(server.url)
    holder = FairAllocator(admin, pool_name)
    holder.extend(["r"])
    held = holder.acquire()
    if flavour == "sync":
        waiter = FairAllocator(redis.Redis.from_url(server.url), pool_name)
        call = Background(lambda: waiter.acquire(timeout=4.0))
    else:
        loop = LoopThread()

        async def wait() -> Any:
            client = redis.asyncio.Redis.from_url(server.url)
            try:
                return await AsyncFairAllocator(client, pool_name).acquire(timeout=4.0)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

        call = Background(lambda: loop.run(wait()))
    wait_until(lambda: holder.status().waiting == 1, what="the waiter queued")
    assert held.resource == "r"
    server.stop()
    with pytest.raises(AcquireTimeout) as timed_out:
        call.join(60)
    assert isinstance(timed_out.value.__cause__, RedisConnectionError), timed_out.value.__cause__
    if flavour == "async":
        loop.drain()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_reader_refused_by_the_server_makes_its_waiter_raise_at_once(
    server: RedisServer, pool_name: str, flavour: str
) -> None:
    """The password of a waiting client's user is changed and its
    connections are killed: its reader reconnects and is refused. The
    refusal is not retried for ever in the background: the waiter raises
    AuthenticationError long before its timeout."""
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">old", "~*", "+@all")
    holder = FairAllocator(admin, pool_name)
    holder.extend(["r"])
    holder.acquire(ttl=3600)  # no deadline comes to wake the waiter
    url = server.url.replace("redis://", "redis://worker:old@")
    if flavour == "sync":
        waiter = FairAllocator(redis.Redis.from_url(url), pool_name)
        call = Background(lambda: waiter.acquire(timeout=600))
    else:
        loop = LoopThread()

        async def wait() -> Any:
            client = redis.asyncio.Redis.from_url(url)
            try:
                return await AsyncFairAllocator(client, pool_name).acquire(timeout=600)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

        call = Background(lambda: loop.run(wait(), timeout=None))
    wait_until(lambda: holder.status().waiting == 1, what="the waiter queued")
    admin.execute_command("ACL", "SETUSER", "worker", "resetpass", ">new")
    admin.execute_command("CLIENT", "KILL", "USER", "worker")
    # Before the fix the reader retried the refusal as a lost connection,
    # silently, and the waiter sat out its 600 s (the join guard fails).
    with pytest.raises(AuthenticationError):
        call.join(60)
    if flavour == "async":
        loop.drain()
    admin.close()


# -- 4. NOSCRIPT between the reload and the retry ---------------------------------------


def flusher(url: str, stop: Any, ready: Any, functions: bool) -> None:
    client = redis.Redis.from_url(url)
    ready.set()
    while not stop.value:
        if functions:
            client.function_flush()
        client.script_flush()


@pytest.mark.slow  # two processes flush in a loop under 300 rounds of calls
@pytest.mark.parametrize("path", [SCRIPTS, FUNCTIONS])
def test_a_storm_of_flushes_never_reaches_the_caller(
    redis_url: str, pool_name: str, path: str, monkeypatch: Any
) -> None:
    """Scripts flushed between the reload and the retry (NOSCRIPT), or the
    Functions library lost between two calls (a restart, a failover,
    FUNCTION FLUSH): the call loads what it needs again within itself."""
    client = redis.Redis.from_url(redis_url)
    if path == SCRIPTS:
        monkeypatch.setattr(scripts(), "enabled", False)  # EVALSHA on every server
    elif int(str(client.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("the server has no Functions")
    pool = FairAllocator(client, pool_name)
    pool.extend(["a", "b"])
    stop, ready = CTX.RawValue("i", 0), CTX.Event()
    storm = [
        CTX.Process(target=flusher, args=(redis_url, stop, ready, path == FUNCTIONS))
        for _ in range(2)
    ]
    for proc in storm:
        proc.start()
    try:
        assert ready.wait(30)
        failures = []
        for _ in range(300):
            try:
                lease = pool.acquire(timeout=30)
                lease = pool.renew(lease)
                assert pool.release(lease)
            except ResponseError as exc:  # before the fix: a few NOSCRIPT in a few hundred
                failures.append(exc)
        assert not failures, f"{len(failures)} calls failed: {failures[:3]}"
    finally:
        stop.value = 1
        for proc in storm:
            proc.join(30)
    assert scripts().mode(client) == path
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (2, 0, 0)
    client.close()


# -- 5. every field read back from a Lease is checked --------------------------------


@pytest.mark.parametrize(
    ("changes", "error", "word"),
    [
        ({"ttl": 1e300}, ValueError, "lease.ttl"),
        ({"ttl": 0}, ValueError, "lease.ttl"),
        ({"ttl": -1.0}, ValueError, "lease.ttl"),
        ({"ttl": math.nan}, ValueError, "lease.ttl"),
        ({"ttl": math.inf}, ValueError, "lease.ttl"),
        ({"ttl": "60"}, TypeError, "lease.ttl"),
        ({"ttl": 10**400}, ValueError, "lease.ttl"),
        ({"id": 5}, TypeError, "lease.id"),
        ({"id": ""}, ValueError, "lease.id"),
        ({"id": "x" * 5000}, ValueError, "lease.id"),
        ({"ticket": "not-a-ticket"}, ValueError, "lease.ticket"),
        ({"ticket": None}, TypeError, "lease.ticket"),
        ({"token": -1}, ValueError, "lease.token"),
        ({"token": "7"}, TypeError, "lease.token"),
        ({"token": 10**400}, ValueError, "lease.token"),
        ({"resource": b"r"}, TypeError, "lease.resource"),
        ({"pool": 3}, TypeError, "lease.pool"),
    ],
)
def test_a_forged_lease_is_refused_before_any_io(
    redis_url: str, pool_name: str, changes: dict[str, Any], error: type, word: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    lease = pool.acquire(timeout=10, ttl=30)
    forged = attrs.evolve(lease, **changes)
    with pytest.raises(error, match=word):
        pool.renew(forged)
    with pytest.raises(error, match=word):
        pool.release(forged) if "ttl" not in changes else pool.renew(forged, ttl=None)
    # The real lease is untouched: its deadline did not move, it is still held.
    assert pool.renew(lease, ttl=30).expires_at >= lease.expires_at
    assert pool.release(lease)
    client.close()


# -- 6. a client of the wrong kind is refused at construction ------------------------


def test_a_client_of_the_wrong_kind_is_refused_at_construction(redis_url: str) -> None:
    import fakeredis

    loop = LoopThread()
    try:
        for made in (redis.asyncio.Redis.from_url(redis_url), fakeredis.FakeAsyncRedis()):
            with pytest.raises(TypeError, match=r"asyncio.*AsyncFairAllocator"):
                FairAllocator(made, "p")
            loop.run(made.aclose())
        for made in (redis.Redis.from_url(redis_url), fakeredis.FakeRedis()):
            with pytest.raises(TypeError, match=r"blocking.*use FairAllocator"):
                AsyncFairAllocator(made, "p")
            made.close()
    finally:
        loop.close()
    with pytest.raises(TypeError, match="redis-py client"):
        FairAllocator("redis://localhost", "p")


# -- 8. backoff with jitter ------------------------------------------------------------


class Recording(FairAllocator):
    """Records the backoff sleeps of its calls (and does not sleep)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sleeps: list[float] = []

    def _step(self, step: Any) -> Any:
        if isinstance(step, Sleep):
            self.sleeps.append(step.seconds)
            if len(self.sleeps) >= 8:
                raise KeyboardInterrupt  # enough seen: stop the call
            return None
        return super()._step(step)


def test_retries_back_off_with_jitter(server: RedisServer, pool_name: str) -> None:
    url = server.url
    server.stop()
    seen = []
    for _ in range(3):  # three clients that lost the server together
        pool = Recording(redis.Redis.from_url(url), pool_name)
        with pytest.raises(KeyboardInterrupt):
            pool.acquire()  # no timeout: retried until interrupted
        seen.append(pool.sleeps)
    # They do not retry in lockstep (before the fix: 0.05, 0.1, 0.2, ... each).
    assert len({tuple(s) for s in seen}) == 3, seen
    for sleeps in seen:
        assert all(0 <= s <= 2.0 for s in sleeps), sleeps


def test_backoff_is_full_jitter_and_capped() -> None:
    from allocator._core.retry import Retrier

    random.seed(8)
    retrier = Retrier("x", base=0.05, cap=1.0)
    error = RedisConnectionError("down")
    delays = [retrier.next_delay(error) for _ in range(40)]
    assert all(d is not None and 0 <= d <= 1.0 for d in delays)
    assert len(set(delays)) == len(delays)
    assert max(d for d in delays if d is not None) > 0.5  # grows up to the cap
    bounded = Retrier("x", attempts=3)
    assert [bounded.next_delay(error) is None for _ in range(3)] == [False, False, True]
    assert Retrier("x").next_delay(AuthenticationError("no")) is None


class _Counted(AbstractBackoff):
    """A backoff that counts, on its class (redis-py copies a client's
    ``Retry`` into each connection), how often it is asked, and waits no
    time."""

    asked = 0

    def reset(self) -> None:
        pass

    def compute(self, failures: int) -> float:
        type(self).asked += 1
        return 0.0


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_reader_round_connects_with_one_try(shell: str) -> None:
    """The reader's round connects as the library's calls do, with the
    client's own retries switched off: one try, the rounds' own pauses
    deciding when to try again. redis-py's retries would sleep past the
    round's bound, and draw their jitter from the program's global
    `random`."""
    _Counted.asked = 0

    def unreachable_round(pool: Any, reader: Any) -> Any:
        return reader._exchange([], [pool._pool.signal_key(reader.cid)], 0.1, 0.5)

    if shell == "sync":
        client = redis.Redis(port=1, socket_connect_timeout=0.5, retry=Retry(_Counted(), 5))
        pool = FairAllocator(client, "unreachable")
        with pytest.raises(RedisConnectionError):
            unreachable_round(pool, pool._reader())
    else:

        async def scenario() -> None:
            from redis.asyncio.retry import Retry as AsyncRetry

            client = redis.asyncio.Redis(
                port=1, socket_connect_timeout=0.5, retry=AsyncRetry(_Counted(), 5)
            )
            pool = AsyncFairAllocator(client, "unreachable")
            with pytest.raises(RedisConnectionError):
                await unreachable_round(pool, pool._reader())
            await client.aclose()

        asyncio.run(scenario())
    assert _Counted.asked == 0


# -- 10. huge numbers and the timeout bound ------------------------------------------


@pytest.mark.parametrize(
    ("call", "word"),
    [
        (lambda p: p.acquire(timeout=10**400), "timeout"),
        (lambda p: p.acquire(timeout=1e10), "timeout"),
        (lambda p: p.acquire(ttl=10**400), "ttl"),
        (lambda p: p.renew(p.acquire(timeout=10), ttl=10**400), "ttl"),
        (lambda p: p.release(p.acquire(timeout=10), quarantine=10**400), "quarantine"),
        (lambda p: p.extend(["x"], priority=10**400), "priority"),
        (lambda p: p.extend(["x"], priority=-(10**400)), "priority"),
        (lambda p: p.extend(["x"], capacity=10**400), "capacity"),
        (lambda p: p.extend(["x"], rate=(10**400, 1)), "rate count"),
        (lambda p: p.extend(["x"], rate=(1, 10**400)), "rate seconds"),
        (lambda p: FairAllocator(p.client, "q", lease_ttl=10**400), "lease_ttl"),
        (lambda p: FairAllocator(p.client, "q", bind_ttl=10**400), "bind_ttl"),
    ],
)
def test_huge_numbers_name_their_argument(
    client: Any, pool_name: str, call: Any, word: str
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    with pytest.raises(ValueError, match=word):
        call(pool)


def test_the_longest_timeout_waits_without_overflow(client: Any, pool_name: str) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=10)
    waiter = Background(lambda: pool.acquire(timeout=MAX_SECONDS))
    # Nothing wakes it until the resource is released; then it is served.
    wait_until(lambda: pool.status().waiting == 1, what="the waiter in line")
    assert not waiter.done
    assert pool.release(held)
    lease = waiter.join(30)
    assert isinstance(lease, Lease)
    assert pool.release(lease)


# -- 11. the library's calls do not stack the client's own retries ---------------------


class CountingBackoff(AbstractBackoff):
    """redis-py backoff that counts how often the client's Retry backed off
    (on the class: each connection works on a deep copy of its Retry)."""

    count = 0

    def compute(self, failures: int) -> float:
        type(self).count += 1
        return 0.0


def sync_client(url: str) -> Any:
    return redis.Redis.from_url(
        url, retry=Retry(CountingBackoff(), 5), retry_on_error=[RedisConnectionError]
    )


def async_client(url: str) -> Any:
    from redis.asyncio.retry import Retry as AsyncRetry

    return redis.asyncio.Redis.from_url(
        url, retry=AsyncRetry(CountingBackoff(), 5), retry_on_error=[RedisConnectionError]
    )


def test_library_calls_skip_the_clients_retries_user_calls_keep_them(
    server: RedisServer, pool_name: str
) -> None:
    made = sync_client(server.url)
    pool = FairAllocator(made, pool_name)
    pool.extend(["r"])
    server.stop()
    CountingBackoff.count = 0
    with pytest.raises(AcquireTimeout) as timed_out:
        pool.acquire(timeout=1.0)
    assert isinstance(timed_out.value.__cause__, RedisConnectionError)
    for call in (pool.status, pool.gc):
        with pytest.raises(RedisConnectionError):
            call()
    with pytest.raises(RedisConnectionError):
        pool.release(Lease("r", 1, "x" * 22, "1-0", 0.0, 1.0, 0.0, pool_name))
    # Before the fix each library command ran the client's 5 retries (and,
    # with redis-py 8, each connect 5 more) under the library's own.
    assert CountingBackoff.count == 0
    # The user's own commands retry exactly as on a client the library never saw.
    with pytest.raises(RedisConnectionError):
        made.ping()
    used = CountingBackoff.count
    CountingBackoff.count = 0
    with pytest.raises(RedisConnectionError):
        sync_client(server.url).ping()
    assert used == CountingBackoff.count
    made.close()


def test_async_library_calls_skip_the_clients_retries(server: RedisServer, pool_name: str) -> None:
    async def scenario() -> tuple[int, int, int]:
        made = async_client(server.url)
        pool = AsyncFairAllocator(made, pool_name)
        await pool.extend(["r"])
        server.stop()
        CountingBackoff.count = 0
        with pytest.raises(AcquireTimeout) as timed_out:
            await pool.acquire(timeout=1.0)
        assert isinstance(timed_out.value.__cause__, RedisConnectionError)
        with pytest.raises(RedisConnectionError):
            await pool.status()
        library = CountingBackoff.count
        with pytest.raises(RedisConnectionError):
            await made.ping()
        used = CountingBackoff.count - library
        await made.aclose()
        CountingBackoff.count = 0
        fresh = async_client(server.url)
        with pytest.raises(RedisConnectionError):
            await fresh.ping()
        await fresh.aclose()
        return library, used, CountingBackoff.count

    library, used, reference = asyncio.run(scenario())
    assert library == 0
    assert used == reference


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private redis-server that speaks plain text on its own port and TLS
    on the port given (a throw-away self-signed certificate)."""
    import shutil
    import subprocess

    from allocator._server import free_port

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not on PATH (it makes the server's certificate)")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    port = free_port()
    server = RedisServer(
        extra_args=["--tls-port", str(port), "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key), "--tls-auth-clients", "no"]
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server speaks no TLS: {exc}")
    try:
        yield port
    finally:
        server.stop()


def test_a_plain_text_client_of_a_tls_port_fails_at_once_not_at_its_timeout(
    tls_port: int, pool_name: str
) -> None:
    """The server resets the connection at its first reply, which alone
    looks transient; a probe of the address finds it speaks TLS, and the
    call raises at once, saying so, where it retried until its timeout
    (for ever without one)."""
    from allocator._core.retry import PlainTextToTLS

    client = redis.Redis(port=tls_port)
    pool = FairAllocator(client, pool_name)
    # A timeout far longer than the guard: the call must not use it up.
    with pytest.raises(PlainTextToTLS, match="rediss://") as raised:
        Background(lambda: pool.acquire(timeout=600)).join(60)
    assert isinstance(raised.value.__cause__, RedisConnectionError)
    assert isinstance(raised.value, RedisConnectionError)  # what users already catch
    with pytest.raises(PlainTextToTLS):
        Background(pool.status).join(60)
    client.close()

    async def asyncio_side() -> BaseException | None:
        aclient = redis.asyncio.Redis(port=tls_port)
        try:
            await AsyncFairAllocator(aclient, pool_name).acquire(timeout=600)
        except Exception as exc:
            return exc
        finally:
            await aclient.aclose()
        return None

    outcome = Background(lambda: asyncio.run(asyncio_side())).join(60)
    assert isinstance(outcome, PlainTextToTLS), outcome


def test_a_reset_from_a_plain_text_server_stays_transient(server: RedisServer) -> None:
    """A reset by a server that speaks plain text (a restart, a kill) is
    retried as before: the probe finds no TLS there."""
    from allocator._core.retry import is_transient, reset_by_peer
    from allocator._probe import refine

    reset = RedisConnectionError(
        f"Error while reading from 127.0.0.1:{server.port} : (104, 'Connection reset by peer')"
    )
    assert reset_by_peer(reset) and is_transient(reset)
    assert refine(redis.Redis(port=server.port), reset) is reset
    assert not reset_by_peer(RedisConnectionError("Error 111 connecting to 127.0.0.1:1"))
