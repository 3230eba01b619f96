"""The retry policy: which errors pass by themselves, how long to back off,
when to give up, what to log (:class:`Retrier`). Every flow and both
readers decide with it; a flow retries a call with :func:`retrying`, and a
call with no deadline of its own with :func:`retry_single` (a pool's own
budget: :meth:`SingleCalls._single`)."""

from __future__ import annotations

import logging
import random
import ssl
import time
from typing import TypeVar

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    ClusterError,
    NoPermissionError,
    ReadOnlyError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .replies import server_refusal
from .steps import Call, Flow, Sleep

#: The jitter of every pause of the core (retries, the reader's and the
#: presence's backoff): a generator of the library's own, so that the
#: library never moves the program's global ``random`` state.
JITTER = random.Random()
_jitter = JITTER

_log = logging.getLogger("allocator")

T = TypeVar("T")

#: How long a call with no deadline of its own (a single-call operation such
#: as ``release`` or ``status``, a non-blocking ``acquire``) keeps retrying
#: transient errors before it lets the last one through. Every socket read
#: of the call ends within it too, so a hung server costs no more.
RETRY_BUDGET = 2.0
#: The same on a Sentinel-managed client: long enough to ride out a failover
#: with Sentinel's default settings. The master is deemed down after
#: ``down-after-milliseconds`` (30 s by default) of silence; then the
#: Sentinels agree on it (they ask each other every second), elect a leader
#: (up to a second of random delay, then one vote), the leader promotes a
#: replica and publishes its address: 31 s in all, measured on loopback
#: (docs/operations.md, "Sentinel"). Meanwhile the call meets refused
#: connections, the old master's READONLY, or redis-py's
#: ``MasterNotFoundError`` (no master the Sentinels vouch for): all
#: transient. A failover whose first election fails is tried again only
#: after twice ``failover-timeout`` (6 min by default): no call waits that.
FAILOVER_BUDGET = 45.0
#: The least time one try of a call gets for its replies, however little is
#: left of its deadline: one round trip to a distant server, so that an
#: ``acquire(timeout=0)`` still asks once.
MIN_TRY = 0.1
#: The budget of a call made on the side of a flow whose own deadline may
#: have passed: the cancel of an acquire that gave up (if it cannot be sent
#: in time, the ticket's liveness mark runs out and the queue drops it), and
#: the check of the server's eviction policy (advisory: skipped on failure).
#: A round trip to a loaded server, and short enough that a call against a
#: hung one returns within its deadline plus 0.2 s.
SIDE_BUDGET = 0.15
#: Full-jitter backoff between two tries: a uniform draw in
#: [0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n)] after the n-th failure.
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
#: An outage (transient errors without a success in between) this long is
#: logged once at warning; each retry before that is logged at debug.
OUTAGE_WARNING = 10.0

#: Errors that pass: a lost connection, a server still loading its data, a
#: failover (a demoted master answers READONLY), a cluster slot in migration
#: (TRYAGAIN until redis-py gives up) or a cluster that is reconfiguring.
#: Every script is safe to run again, so these are retried within the
#: caller's deadline. Some permanent errors are subclasses of these
#: (:data:`PERMANENT_ERRORS`): :func:`is_transient` tells them apart.
TRANSIENT_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterError,
    TryAgainError,
    ReadOnlyError,
    SlotNotCoveredError,
)


class PlainTextToTLS(RedisConnectionError):
    """A client that speaks plain text connected to a server that speaks
    TLS (its connection reset at the first reply, and a probe of the
    address completed a TLS handshake: allocator/_probe.py). No retry mends
    it: the client needs a ``rediss://`` URL (``ssl=True``)."""


#: What a server does to a connection it will not talk to: redis-py's
#: words for a connection reset, or closed before the first reply.
_RESET_TEXTS = ("Connection reset by peer", "Connection closed by server")


def reset_by_peer(error: BaseException) -> bool:
    """Whether ``error`` is a transport error of a connection the server
    reset or closed (as a TLS port does to a client that speaks plain
    text); the shells then ask whether the server speaks TLS."""
    if not isinstance(error, RedisConnectionError) or isinstance(error, PERMANENT_ERRORS):
        return False
    seen: BaseException | None = error
    for _ in range(8):  # the cause chain, bounded
        if seen is None:
            break
        if isinstance(seen, ConnectionResetError):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    return any(marker in text for marker in _RESET_TEXTS)


#: Misconfigurations that no retry mends: a wrong password or user, an ACL
#: that refuses a command or key, a TLS handshake or certificate refused.
#: redis-py makes the first two subclasses of its ``ConnectionError``.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    AuthenticationError,
    AuthorizationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    ssl.SSLError,
    ssl.CertificateError,
    PlainTextToTLS,
)
try:  # redis-py >= 5.1
    from redis.exceptions import ExternalAuthProviderError

    PERMANENT_ERRORS += (ExternalAuthProviderError,)
except ImportError:  # pragma: no cover
    pass

#: Texts of server errors that mean the same when redis-py does not map them
#: to one of the classes above (or wraps them in a ConnectionError).
_PERMANENT_TEXTS = ("WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "CERTIFICATE_VERIFY")


def try_deadline(
    deadline: float | None, per_try: float | None = None, floor: float = MIN_TRY
) -> float | None:
    """When one try of a call must have its replies (monotonic seconds):
    the call's ``deadline``, no later than ``per_try`` seconds from now, and
    no sooner than ``floor`` seconds from now. None (neither bound): the
    client's own socket timeout alone bounds the try."""
    if deadline is None and per_try is None:
        return None
    now = time.monotonic()
    if per_try is not None:
        deadline = now + per_try if deadline is None else min(deadline, now + per_try)
    assert deadline is not None
    return max(deadline, now + floor)


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may pass by itself, so that the call is worth retrying.

    True for the transport errors of :data:`TRANSIENT_ERRORS`, unless the
    error is (or was raised while handling) a permanent one: an
    authentication or ACL refusal, a TLS error (redis-py turns an
    ``ssl.SSLError`` into a ``ConnectionError`` raised from it). The shells'
    flows and the readers both decide with this.
    """
    if not isinstance(error, TRANSIENT_ERRORS):
        return False
    seen: BaseException | None = error
    for _ in range(8):  # the cause chain, bounded
        if seen is None:
            break
        if isinstance(seen, PERMANENT_ERRORS):
            return False
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    return not any(marker in text for marker in _PERMANENT_TEXTS)


class Retrier:
    """The retry policy of one call (or of one reader loop): which errors to
    retry, how long to back off, when to give up, what to log.

    Use::

        retrier = Retrier("status", deadline=time.monotonic() + 2)
        while True:
            try:
                reply = run()
            except Exception as exc:
                delay = retrier.next_delay(exc)
                if delay is None:
                    raise
                sleep(delay)
                continue
            retrier.succeeded()

    ``deadline`` (monotonic seconds) and ``attempts`` bound the tries; with
    neither, transient errors are retried for ever (a reader, a blocking
    acquire without timeout). Delays are full jitter
    (``uniform(0, min(cap, base * 2**n))``), so that clients that lost the
    server together do not come back in lockstep, and never reach past the
    deadline. Each retry is logged at debug on logger ``allocator``; an
    outage longer than :data:`OUTAGE_WARNING` is logged once at warning,
    and its end at info. ``last_error`` is the last error seen, for a
    caller that gives up for another reason (an AcquireTimeout chains it).
    """

    def __init__(
        self,
        what: str,
        *,
        deadline: float | None = None,
        attempts: int | None = None,
        base: float = BACKOFF_BASE,
        cap: float = BACKOFF_CAP,
        warn_after: float | None = None,
    ) -> None:
        self.what = what
        self.deadline = deadline
        self.attempts = attempts
        self.base = base
        self.cap = cap
        self.warn_after = OUTAGE_WARNING if warn_after is None else warn_after
        self.failures = 0
        self.last_error: BaseException | None = None
        self._outage_since: float | None = None
        self._warned = False

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def next_delay(self, error: BaseException) -> float | None:
        """Seconds to wait before the next try after ``error``, or None if
        the caller must give up and raise it: a permanent error, no
        attempts left, or the deadline reached."""
        self.last_error = error
        if not is_transient(error):
            return None
        now = time.monotonic()
        self.failures += 1
        if self._outage_since is None:
            self._outage_since = now
        if self.attempts is not None and self.failures >= self.attempts:
            return None
        remaining = None if self.deadline is None else self.deadline - now
        if remaining is not None and remaining <= 0:
            return None
        ceiling = min(self.cap, self.base * 2 ** min(self.failures - 1, 32))
        delay = _jitter.uniform(0, ceiling)
        if remaining is not None:
            delay = min(delay, remaining)
        outage = now - self._outage_since
        if outage >= self.warn_after and not self._warned:
            self._warned = True
            _log.warning(
                "allocator: %s: Redis unreachable for %.1f s, still retrying: %r",
                self.what,
                outage,
                error,
            )
        else:
            _log.debug(
                "allocator: %s: retry %d in %.3f s after %r", self.what, self.failures, delay, error
            )
        return delay

    def succeeded(self) -> None:
        """A try went through: the next failure starts a new outage."""
        if self._warned and self._outage_since is not None:
            _log.info(
                "allocator: %s: Redis reachable again after %.1f s",
                self.what,
                time.monotonic() - self._outage_since,
            )
        self.failures = 0
        self._outage_since = None
        self._warned = False


def retrying(
    call: Call[T],
    *,
    deadline: float | None = None,
    attempts: int | None = None,
    per_try: float | None = None,
    cap: float = BACKOFF_CAP,
) -> Flow[T]:
    """Run ``call``, retrying transient errors with backoff (at most
    ``cap`` seconds between two tries): until ``deadline`` (monotonic;
    None: for ever) or for ``attempts`` tries.
    Every script is safe to run again after a reply was lost. (A script
    the server no longer has never gets here: the shells run a call
    that meets NOSCRIPT again at once by the script's text, EVAL.)

    Each try is due by the deadline (:func:`try_deadline`: no later than
    ``per_try`` from its start, no sooner than one round trip, plus the
    WAIT of a confirmed call), so a hung server costs a try no more
    than what is left: its read times out, and the deadline decides."""
    retrier = None  # made on the first failure: most calls never fail
    floor = MIN_TRY if call.confirm is None else MIN_TRY + call.confirm[1] / 1000
    while True:
        if deadline is not None or per_try is not None:
            call = call.until(try_deadline(deadline, per_try, floor))
        try:
            reply = yield call
        except Exception as exc:
            if retrier is None:
                retrier = Retrier(call.script, deadline=deadline, attempts=attempts, cap=cap)
            delay = retrier.next_delay(exc)
            if delay is None:
                refused = server_refusal(exc)
                if refused is not None:
                    raise refused from exc
                raise
            yield Sleep(delay)
            continue
        return call.parse(reply)


def retry_single(
    call: Call[T], budget: float = RETRY_BUDGET, per_try: float | None = None
) -> Flow[T]:
    """Run ``call``, retrying for ``budget`` seconds from its first try."""
    return (yield from retrying(call, deadline=time.monotonic() + budget, per_try=per_try))


class SingleCalls:
    """The retries of a pool's calls that have no deadline of their own
    (release, status, ...): a part of :class:`~.base.PoolBase`, whose
    settings give the budgets."""

    __slots__ = ()

    #: See :attr:`.base.PoolBase.call_budget`.
    call_budget: float
    try_budget: float | None

    def _single(self, call: Call[T]) -> Flow[T]:
        """Run a call that has no deadline of its own, within the pool's
        single-call budget (:attr:`call_budget`)."""
        return retry_single(call, self.call_budget, self.try_budget)
