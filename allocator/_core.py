"""The I/O-free core that `FairAllocator` and `AsyncFairAllocator` share.

Everything that decides anything lives here: argument checks, the pool's key
names, the script call of each operation and the parsing of its reply into a
value or an exception. An operation is a generator of *steps*:

- :class:`Call`: run this script, send me its reply;
- :class:`Wait`: block on this signal list for up to N seconds, send me the
  message (or None on timeout);
- :class:`Sleep`: back off for N seconds.

The shells (`_sync.py`, `_async.py`) only carry steps out, with blocking or
awaiting I/O. A transport error raised by a step is thrown back into the
generator, which decides whether to retry; the same goes for
``KeyboardInterrupt`` and task cancellation, which make a waiting acquire
leave the queue before the exception goes on.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import random
import re
import secrets
import socket
import ssl
import time
import warnings
from collections.abc import Callable, Generator, Iterable
from typing import (
    Any,
    Generic,
    NamedTuple,
    TypeVar,
    cast,
)

import attrs
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    ClusterError,
    MovedError,
    NoPermissionError,
    ReadOnlyError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._values import GCReport, Lease, LeaseInfo, PoolStats, PoolStatus, ResourceStatus
from .errors import AcquireTimeout, AllocatorError, LeaseLost, NotReplicated, UnknownResource

__all__ = [
    "ALIVE",
    "HEARTBEAT",
    "Call",
    "Command",
    "Flow",
    "Hub",
    "Pool",
    "Retrier",
    "Sleep",
    "Step",
    "Wait",
    "acl_key_pattern",
    "default_owner",
    "is_transient",
    "pool_names",
    "pools_pattern",
]

_log = logging.getLogger("allocator")

T = TypeVar("T")

#: Longest a client's reader blocks on its signal list before it refreshes
#: the client's liveness mark (a poll that also serves the queue). Kept well
#: under redis-py's default socket timeout (5 s), so that a blocking read
#: never trips it.
HEARTBEAT = 1.0
#: The longest silence a client's reader may keep (a stalled event loop, a
#: C call holding the GIL, a paused process) without its waiters losing
#: their place or a grant pushed to them. Each refresh marks the client
#: alive for ALIVE plus one heartbeat, the longest gap between refreshes.
#: Past that, the client counts as gone: its tickets are dropped from the
#: queue and grants it has not acknowledged are taken back.
ALIVE = 4.0
#: Messages a reader pops from one signal list per round trip.
BATCH = 256
#: Delivered grants a hub remembers, so that a grant message it sees again
#: (put back on the list after a lost reply) is not taken for a stray one.
RECENT = 4096
#: Resources per script run in extend/remove, so one huge call does not
#: block the server for long; each run leaves the pool consistent.
CHUNK = 500
#: Entries per gc step.
GC_COUNT = 100
#: How long a call with no deadline of its own (a single-call operation such
#: as ``release`` or ``status``, a non-blocking ``acquire``) keeps retrying
#: transient errors before it lets the last one through.
RETRY_BUDGET = 2.0
#: Full-jitter backoff between two tries: a uniform draw in
#: [0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n)] after the n-th failure.
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
#: An outage (transient errors without a success in between) this long is
#: logged once at warning; each retry before that is logged at debug.
OUTAGE_WARNING = 10.0

#: The liveness mark a refresh sets, in ms (see ALIVE).
ALIVE_MS = round((ALIVE + HEARTBEAT) * 1000)
#: How long a reader with nobody left waiting keeps retrying the
#: acknowledgements it could not send: past the liveness mark and one
#: pick-up check (PICKUP_MS in prelude.lua), the server has taken back every
#: grant that was not acknowledged, so the acknowledgement no longer matters
#: and the reader ends instead of retrying a gone server for ever.
ACK_GIVE_UP = ALIVE_MS / 1000 + 2.0

MAX_NAME = 200
MAX_RESOURCE = 1024
#: The longest duration any argument may give (ttl, timeout, quarantine,
#: rate window): ten years. A wait of "for ever" is ``timeout=None``.
MAX_SECONDS = 10 * 365 * 24 * 3600.0
#: Priorities are scores of a sorted set (doubles): beyond this they would
#: lose the difference between neighbours.
MAX_PRIORITY = 1e15
#: Bounds of what a Lease's fields may hold (see Pool._check_lease).
MAX_LEASE_ID = 128
#: The most resources one acquire_many may ask for (its script reads the
#: records of all of them in one call, and Lua unpacks at most a few
#: thousand values). The server also refuses a count larger than the pool.
MAX_COUNT = 1000
#: The most replicas ``min_replicas`` may ask for.
MAX_REPLICAS = 1000
MAX_TOKEN = 2**63 - 1

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
)
try:  # redis-py >= 5.1
    from redis.exceptions import ExternalAuthProviderError

    PERMANENT_ERRORS += (ExternalAuthProviderError,)
except ImportError:  # pragma: no cover
    pass

#: Texts of server errors that mean the same when redis-py does not map them
#: to one of the classes above (or wraps them in a ConnectionError).
_PERMANENT_TEXTS = ("WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "CERTIFICATE_VERIFY")


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
        delay = random.uniform(0, ceiling)
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


KEY_SUFFIXES = (
    "meta", "res", "gone", "free", "park", "q", "recs", "exp", "bind", "bexp", "alive", "rlog",
    "pick", "held", "stats",
)  # fmt: skip

#: Upper bounds (seconds) of the wait histogram's buckets, as the scripts
#: keep them (P:count_wait in prelude.lua, in ms): field ``w<i>`` of the
#: ``stats`` hash counts the grants whose wait fell in bucket i (1-based),
#: ``w0`` those beyond the last bound.
WAIT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

_OWNER: list[tuple[int, str]] = []


def default_owner() -> str:
    """``<hostname>:<pid>``, the owner of a lease when the caller names none
    (worked out once per process: a forked child has its own pid)."""
    pid = os.getpid()
    if not _OWNER or _OWNER[0][0] != pid:
        host = socket.gethostname() or "localhost"
        _OWNER[:] = [(pid, _clean(f"{host}:{pid}")[:MAX_NAME])]
    return _OWNER[0][1]


def _clean(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text) or "?"


def _owner(value: object) -> str:
    return default_owner() if value is None else _text("owner", value, MAX_NAME)


def pools_pattern(prefix: object) -> str:
    """The SCAN pattern that finds the keys of every pool under ``prefix``
    (glob characters of the prefix escaped, so that it matches no other
    prefix). Any key of a pool tells that it exists: a pool may have a
    queue and no resources yet, or resources and no bookkeeping yet."""
    prefix = _text("prefix", prefix, MAX_NAME)
    return _glob_escape(_escape(prefix)) + ":{*}:*"


_UNESCAPE = {"%25": "%", "%7B": "{", "%7D": "}"}


def pool_names(keys: Iterable[Any], prefix: str) -> list[str]:
    """The pool names in ``keys`` (SCAN replies for :func:`pools_pattern`),
    unescaped, each once, sorted. Signal lists and keys of other shapes are
    not a pool's keys."""
    head = _escape(prefix) + ":{"
    names = set()
    for key in keys:
        text = _decode(key)
        if not text.startswith(head):
            continue
        middle, brace, suffix = text[len(head) :].partition("}:")
        if brace and suffix in KEY_SUFFIXES and "{" not in middle:
            names.add(re.sub("%(25|7B|7D)", lambda m: _UNESCAPE[m.group(0)], middle))
    return sorted(names)


def stats_from_fields(name: str, fields: dict[str, int], server_time: float) -> PoolStats:
    """A :class:`PoolStats` from the fields of a pool's ``stats`` hash."""
    counts = [fields.get(f"w{i}", 0) for i in range(1, len(WAIT_BOUNDS) + 1)]
    counts.append(fields.get("w0", 0))
    buckets, total = [], 0
    for bound, count in zip((*WAIT_BOUNDS, math.inf), counts, strict=True):
        total += count
        buckets.append((bound, total))
    return PoolStats(
        name=name,
        grants=total,
        timeouts=fields.get("timeouts", 0),
        reclaimed=fields.get("reclaimed", 0),
        revoked=fields.get("revoked", 0),
        dropped_waiters=fields.get("dropped", 0),
        wait_seconds=tuple(buckets),
        wait_seconds_sum=fields.get("ws", 0) / 1000,
        server_time=server_time,
    )


# --------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------


@attrs.frozen
class Call(Generic[T]):
    """Run script ``script`` with these keys and args; ``parse`` reads the reply."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    parse: Callable[[Any], T] = attrs.field(repr=False)
    #: ``(replicas, timeout_ms)``: the write must be confirmed by that many
    #: replicas. The shells send :func:`confirm_commands` in one pipeline on
    #: one connection and hand :func:`confirmed` of the replies to ``parse``.
    confirm: tuple[int, int] | None = None


class Wait(NamedTuple):
    """Wait up to ``timeout`` seconds (None: no limit) for the next message
    the client's reader routes to waiter ``lid``; send it, or, when none
    came in time, the reader's :attr:`Hub.trouble` (None, or its last error
    while it fails)."""

    lid: str
    timeout: float | None


class Sleep(NamedTuple):
    seconds: float


class Command(NamedTuple):
    """Run a plain Redis command (not a script); the flow reads the reply."""

    args: tuple[str, ...]


Step = Call[Any] | Wait | Sleep | Command
Flow = Generator[Step, Any, T]


class Beat(NamedTuple):
    """A reader's heartbeat: run each pool's poll call (``(key, call)``, no
    retries of its own); send back the ``(key, parsed reply)`` pairs."""

    calls: list[tuple[str, Call[Any]]]


class Exchange(NamedTuple):
    """A reader's round trip (:func:`round_commands`): acknowledge, block
    on ``keys`` up to ``block`` seconds, pop; send back the popped
    ``(key, message)`` pairs."""

    acks: list[tuple[str, list[str]]]
    keys: list[str]
    block: float


class Deliver(NamedTuple):
    """Put each ``(inbox, item)`` in its waiter's inbox, and release each
    grant whose waiter left (``Pool._single(call)``). The reader does not
    yield to the woken waiters before its next round: on 2 cores that made
    a 2-process handoff 5 % faster and the throughput of 32 processes 18 %
    slower (docs/performance.md)."""

    items: list[tuple[Any, Any]]
    releases: list[Call[Any]]


ReaderStep = Beat | Exchange | Deliver | Sleep


# --------------------------------------------------------------------------
# Confirming writes on replicas (CONTRACT.md section 9)
# --------------------------------------------------------------------------
#
# Redis's WAIT counts the replicas that acknowledged the replication offset
# of the *calling connection's* last write (its ``woff``), not every write
# the server had when WAIT came: a WAIT on a connection that wrote nothing,
# or wrote long ago, answers at once with a count that says nothing about a
# grant some other client's script made. So a confirmed call is sent as
#
#     EVALSHA <script> ...; HINCRBY <meta> wseq 1; WAIT <replicas> <ms>
#
# in one pipeline on one connection. HINCRBY always changes the server (a
# script that found nothing to do, or an acquire retried after a lost reply
# that finds its grant made by the first try, may write nothing), so it is
# always replicated, and it runs after the script on the same master: the
# replication stream is ordered, so a replica that acknowledged it has every
# write the script saw, the grant among them, whoever made it. The same holds
# for a grant pushed to a waiter by another client's release: the waiter
# confirms it with a confirmed ``renew`` of the lease, whose script reads the
# grant (so runs after it) before the marker and the WAIT.


class Confirmed(NamedTuple):
    """The reply of a confirmed call: the script's reply and how many
    replicas acknowledged it (WAIT's answer)."""

    reply: Any
    replicas: int


#: The field of the pool's META hash that the confirmation marker bumps.
CONFIRM_FIELD = "wseq"


#: The commands that run a script (``Scripts.invoke`` yields one of them,
#: after a ``FUNCTION LOAD`` perhaps).
SCRIPT_COMMANDS = frozenset({"FCALL", "FCALL_RO", "EVALSHA", "EVAL"})


def confirm_commands(call: Call[Any], command: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The pipeline of a confirmed call: the script ``command`` (FCALL,
    EVALSHA or EVAL), the marker write, WAIT."""
    assert call.confirm is not None, "not a confirmed call"
    replicas, timeout_ms = call.confirm
    return [
        command,
        ("HINCRBY", call.keys[0], CONFIRM_FIELD, 1),
        ("WAIT", replicas, timeout_ms),
    ]


def confirming(
    call: Call[Any], commands: Generator[tuple[Any, ...], Any, Any]
) -> Generator[tuple[Any, ...] | list[tuple[Any, ...]], Any, Confirmed]:
    """The commands of a confirmed call: those of ``commands`` (the
    script's, from ``Scripts.invoke``), each script command sent as the
    pipeline of :func:`confirm_commands` (a list: the shells send it on one
    connection and send back the replies, errors as values). The script's
    reply or error goes back to ``commands``, which decides (NOSCRIPT: by
    text; a missing library: load it); returns the script's reply and the
    replicas that confirmed it."""
    replicas = 0
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            command = commands.send(reply) if error is None else commands.throw(error)
        except StopIteration as stop:
            return Confirmed(stop.value, replicas)
        reply, error = None, None
        if _decode(command[0]).upper() not in SCRIPT_COMMANDS:
            try:
                reply = yield command
            except Exception as exc:
                error = exc
            continue
        replies = yield confirm_commands(call, command)
        if len(replies) != 3:
            raise AllocatorError(f"unexpected replies to a confirmed call: {replies!r}")
        for item in replies:
            if isinstance(item, (MovedError, AskError)):
                # The slot moved or is moving: transient, like TRYAGAIN.
                raise ClusterError(f"the pool's slot is moving: {item}") from item
        script, marker, acked = replies
        for item in (marker, acked):
            if isinstance(item, Exception):
                raise item
        if isinstance(script, Exception):
            error = script
            continue
        reply, replicas = script, int(acked)


def moved(replies: list[Any]) -> bool:
    """A confirmed call sent to a cluster node that no longer serves the
    pool's slot: the shell refreshes its slot map (:func:`confirming` then
    raises a transient error, and the flow tries again)."""
    return any(isinstance(reply, MovedError) for reply in replies)


#: Put on a waiter's queue by the asyncio router to make it poll once.
RECHECK = "r|"
#: What Pool._message makes of a ``d|<lease id>`` notice: the pool was
#: deleted while this requester waited.
DELETED = "d|"


# --------------------------------------------------------------------------
# Argument checks: all before any I/O, each naming its argument.
# --------------------------------------------------------------------------


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float (10**400)
        bits = int(value).bit_length()
        raise ValueError(f"{name} is out of range: an int of {bits} bits") from None
    if math.isnan(number):
        raise ValueError(f"{name} must be a number, not NaN")
    return number


def _seconds(name: str, value: object, *, minimum: float = 0.001) -> float:
    """A positive duration, at least ``minimum`` seconds."""
    number = _number(name, value)
    if not minimum <= number <= MAX_SECONDS:
        raise ValueError(
            f"{name} must be between {minimum} and {MAX_SECONDS:.0f} seconds, got {value!r}"
        )
    return number


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _timeout(value: object) -> float | None:
    """A wait: 0 to MAX_SECONDS seconds; None or +inf for no limit."""
    if value is None:
        return None
    number = _number("timeout", value)
    if math.isinf(number) and number > 0:
        return None
    if not 0 <= number <= MAX_SECONDS:
        raise ValueError(
            f"timeout must be between 0 and {MAX_SECONDS:.0f} seconds (ten years), or None "
            f"for no limit; got {value!r}"
        )
    return number


def _text(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not 1 <= len(value) <= limit:
        raise ValueError(f"{name} must be 1 to {limit} characters long, got {len(value)}")
    if not value.isprintable():
        raise ValueError(f"{name} must be printable text (no control characters): {value[:50]!r}")
    return value


def _resources(resources: object) -> list[str]:
    if isinstance(resources, (str, bytes)):
        raise TypeError("resources must be an iterable of str, not a single string")
    if not isinstance(resources, Iterable):
        raise TypeError(f"resources must be an iterable of str, not {type(resources).__name__}")
    names = [_text("resources", name, MAX_RESOURCE) for name in resources]
    return list(dict.fromkeys(names))


def _escape(text: str) -> str:
    # Braces would break (or move) the cluster hash tag; % keeps it reversible.
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _glob_escape(text: str) -> str:
    # Redis glob patterns (ACL key patterns, SCAN MATCH): \ first, then the
    # characters that would match more than themselves.
    for char in "\\*?[]":
        text = text.replace(char, "\\" + char)
    return text


def acl_key_pattern(name: str, prefix: str = "alloc") -> str:
    """The ACL key pattern that covers the keys of pool ``name`` and no
    other's: ``alloc:{name}:*``, the name escaped as the keys escape it, and
    the glob characters ``* ? [ ] \\`` escaped so that no name can widen
    it. Use it after ``~`` in ``ACL SETUSER`` (docs/operations.md)."""
    name = _text("name", name, MAX_NAME)
    prefix = _text("prefix", prefix, MAX_NAME)
    return _glob_escape(f"{_escape(prefix)}:{{{_escape(name)}}}") + ":*"


def _stream_id(text: str) -> tuple[int, int]:
    """A stream id ``ms-seq`` as a pair that orders as the stream does."""
    first, _, second = text.partition("-")
    try:
        return int(first), int(second)
    except ValueError:
        return -1, -1


def _decode(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    return str(value)


# --------------------------------------------------------------------------
# Reply parsing: every script reply is read here.
# --------------------------------------------------------------------------


def _tagged(op: str, reply: Any) -> tuple[str, list[Any]]:
    if not isinstance(reply, (list, tuple)) or not reply:
        raise AllocatorError(f"unexpected reply to {op}: {reply!r} (Lua and Python out of step?)")
    return _decode(reply[0]), list(reply[1:])


def _unexpected(op: str, reply: Any) -> AllocatorError:
    return AllocatorError(f"unexpected reply to {op}: {reply!r} (Lua and Python out of step?)")


_GONE = "gone"
_BUSY = "busy"
#: What a waiter learns about its ticket: granted (a lease, or the leases of
#: acquire_many), still queued (ticket and ms until it should look again, or
#: None), gone from the queue, or busy.
State = Lease | list[Lease] | tuple[str, float | None] | str


def many_id(lid: str, index: int) -> str:
    """The lease id of resource ``index`` (from 0) of the acquire_many
    request ``lid`` (prelude.lua ``P.many_id``): ``lid`` itself, then
    ``<lid>.2``, ``<lid>.3``... A lease id from ``secrets.token_urlsafe``
    never holds a dot, so the request's own id is the part before it."""
    return lid if index == 0 else f"{lid}.{index + 1}"


def _many_index(lease_id: str, lid: str) -> int:
    """The index (from 0) of ``lease_id`` in the request ``lid``, or -1."""
    base, dot, number = lease_id.partition(".")
    if base != lid:
        return -1
    if not dot:
        return 0
    return int(number) - 1 if number.isdigit() and number.isascii() else -1


def request_of(lease_id: str) -> str:
    """The request (waiter) a lease id belongs to: see :func:`many_id`."""
    return lease_id.partition(".")[0]


def _count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, not {type(count).__name__}")
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count must be 1 to {MAX_COUNT}, got {count}")
    return count


@attrs.define(eq=False)
class Pool:
    """A pool's identity and settings, and the builder of its operations."""

    name: str
    prefix: str
    lease_ttl: float
    bind_ttl: float
    keys: tuple[str, ...]
    #: Replicas that must confirm a grant or a renewal (0: none, no WAIT).
    min_replicas: int = 0
    #: How long a WAIT for them may block, in seconds.
    replica_timeout: float = 0.5
    _policy_checked: bool = attrs.field(default=False, repr=False)

    @classmethod
    def create(
        cls,
        name: object,
        *,
        lease_ttl: object,
        bind_ttl: object,
        prefix: object,
        min_replicas: object = 0,
        replica_timeout: object = 0.5,
    ) -> Pool:
        name = _text("name", name, MAX_NAME)
        prefix = _text("prefix", prefix, MAX_NAME)
        base = f"{_escape(prefix)}:{{{_escape(name)}}}"
        keys = (*tuple(f"{base}:{suffix}" for suffix in KEY_SUFFIXES), f"{base}:s:")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
            raise TypeError(f"min_replicas must be an int, not {type(min_replicas).__name__}")
        if not 0 <= min_replicas <= MAX_REPLICAS:
            raise ValueError(f"min_replicas must be 0 to {MAX_REPLICAS}, got {min_replicas}")
        return cls(
            name=name,
            prefix=prefix,
            lease_ttl=_seconds("lease_ttl", lease_ttl),
            bind_ttl=_seconds("bind_ttl", bind_ttl),
            keys=keys,
            min_replicas=min_replicas,
            replica_timeout=_seconds("replica_timeout", replica_timeout),
        )

    # -- replicas -------------------------------------------------------------

    def _confirmed(self, call: Call[T]) -> Call[tuple[T, int]]:
        """``call`` sent with the confirmation of :func:`confirm_commands`;
        its parse gives the parsed reply and the replicas that confirmed."""
        parse = call.parse

        def both(reply: Confirmed) -> tuple[T, int]:
            return parse(reply.reply), reply.replicas

        confirm = (self.min_replicas, _ms(self.replica_timeout))
        return Call(call.script, call.keys, call.args, both, confirm=confirm)

    def _not_replicated(self, lease: Lease, replicas: int, what: str) -> NotReplicated:
        return NotReplicated(
            self.name, lease.resource, lease.token, replicas, self.min_replicas, what
        )

    def _give_back(self, lease: Lease, replicas: int) -> Flow[NotReplicated]:
        """A grant that too few replicas confirmed: release it (so nothing
        leaks; a failover that loses it loses nothing either) and return
        the error to raise."""
        _log.warning(
            "allocator: pool %r: grant of %r confirmed by %d of %d replicas; released",
            self.name,
            lease.resource,
            replicas,
            self.min_replicas,
        )
        release = Call("release", self.keys, (lease.id, lease.ticket, "", ""), lambda r: r)
        with contextlib.suppress(Exception):
            # Not confirmed itself: if this release is lost in a failover,
            # the lease ends at its deadline as any unreleased lease does.
            yield from self._single(release)
        return self._not_replicated(lease, replicas, "acquire")

    # -- identity -----------------------------------------------------------

    @property
    def slot(self) -> int:
        """The Redis Cluster hash slot of every key of the pool."""
        return int(key_slot(self.keys[0].encode("utf-8")))

    def signal_key(self, suffix: str) -> str:
        return self.keys[-1] + suffix

    # -- leases ---------------------------------------------------------------

    def _lease(self, lid: str, fields: list[Any]) -> Lease:
        ticket, token, granted_us, deadline_ms, ttl_ms, resource = fields
        return Lease(
            resource=_decode(resource),
            token=int(token),
            id=lid,
            ticket=_decode(ticket),
            expires_at=int(deadline_ms) / 1000,
            ttl=int(ttl_ms) / 1000,
            granted_at=int(granted_us) / 1e6,
            pool=self.name,
        )

    def _state(self, op: str, lid: str, reply: Any) -> State:
        tag, rest = _tagged(op, reply)
        if tag == "granted" and len(rest) == 6:
            return self._lease(lid, rest)
        if tag == "queued" and len(rest) == 2:
            hint = int(rest[1])
            return (_decode(rest[0]), None if hint < 0 else hint / 1000)
        if tag in (_GONE, _BUSY) and not rest:
            return tag
        if tag == "granted_many" and rest and len(rest) % 6 == 0:
            return [
                self._lease(many_id(lid, i // 6), rest[i : i + 6]) for i in range(0, len(rest), 6)
            ]
        if tag == "toomany" and len(rest) == 1:
            raise ValueError(
                f"count is larger than pool {self.name!r}: it has {int(rest[0])} resources"
            )
        raise _unexpected(op, reply)

    def _message(
        self, message: Any, lid: str, ticket: str, count: int | None = None
    ) -> Lease | float | str | None:
        """A message from the signal list: this waiter's grant, a hint (seconds
        until it should look again), RECHECK, or None for anything stale.
        A waiter of acquire_many (``count``) takes the grant of any of its
        leases: the first on its own ticket, the others on the entries
        behind it."""
        text = _decode(message)
        if text == RECHECK:
            return RECHECK
        kind, _, rest = text.partition("|")
        if kind == "g":
            fields = rest.split("|", 5)
            if len(fields) == 6 and (
                (fields[0] == lid and fields[1] == ticket)
                or (
                    count is not None
                    and _many_index(fields[0], lid) in range(1, count)
                    and _stream_id(fields[1]) > _stream_id(ticket)
                )
            ):
                lease_id, _, token, granted_us, ttl_ms, resource = fields
                deadline_ms = int(granted_us) // 1000 + int(ttl_ms)
                return self._lease(
                    lease_id, [fields[1], token, granted_us, deadline_ms, ttl_ms, resource]
                )
        elif kind == "h":
            target, _, delay = rest.partition("|")
            if target == lid:
                return int(delay) / 1000
        elif kind == "x" and request_of(rest) == lid:
            # The grant was taken back while this client looked gone: the
            # waiter must look again (and queue again) at once.
            return RECHECK
        elif kind == "d" and request_of(rest) == lid:
            # The pool was deleted (delete(force=True)): give up, and never
            # queue again (that would make the pool anew). For acquire_many,
            # the notice may name any lease of the request.
            return DELETED
        return None

    def _check_lease(self, lease: object) -> Lease:
        """A lease's fields are the caller's to change (``attrs.evolve``, a
        pickle from elsewhere): check every one the library reads back."""
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        _text("lease.pool", lease.pool, MAX_NAME)
        if lease.pool != self.name:
            raise ValueError(f"lease belongs to pool {lease.pool!r}, not {self.name!r}")
        _text("lease.id", lease.id, MAX_LEASE_ID)
        _text("lease.resource", lease.resource, MAX_RESOURCE)
        ticket = _text("lease.ticket", lease.ticket, 64)
        first, dash, second = ticket.partition("-")
        if not (dash and first.isdigit() and second.isdigit() and first.isascii()):
            raise ValueError(f"lease.ticket must be a stream id like '1700000000000-0': {ticket!r}")
        token = lease.token
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"lease.token must be an int, not {type(token).__name__}")
        if not 0 <= token <= MAX_TOKEN:
            raise ValueError(f"lease.token must be 0 to {MAX_TOKEN}, got {token}")
        _seconds("lease.ttl", lease.ttl)
        return lease

    def _ttl_ms(self, ttl: object) -> int:
        return _ms(self.lease_ttl if ttl is None else _seconds("ttl", ttl))

    # -- retries --------------------------------------------------------------

    @staticmethod
    def _retrying(
        call: Call[T], *, deadline: float | None = None, attempts: int | None = None
    ) -> Flow[T]:
        """Run ``call``, retrying transient errors with backoff: until
        ``deadline`` (monotonic; None: for ever) or for ``attempts`` tries.
        Every script is safe to run again after a reply was lost. (A script
        the server no longer has never gets here: the shells run a call
        that meets NOSCRIPT again at once by the script's text, EVAL.)"""
        retrier = None  # made on the first failure: most calls never fail
        while True:
            try:
                reply = yield call
            except Exception as exc:
                if retrier is None:
                    retrier = Retrier(call.script, deadline=deadline, attempts=attempts)
                delay = retrier.next_delay(exc)
                if delay is None:
                    raise
                yield Sleep(delay)
                continue
            return call.parse(reply)

    @staticmethod
    def _single(call: Call[T]) -> Flow[T]:
        return (yield from Pool._retrying(call, deadline=time.monotonic() + RETRY_BUDGET))

    def _check_policy(self) -> Flow[None]:
        """Warn (once per allocator) if the server may evict the pool's keys.

        The pool uses no keys with a TTL, so ``volatile-*`` policies never
        touch it; an ``allkeys-*`` policy can evict a lease or the queue.
        Run by the admin operations, so the hot path stays one round trip;
        a server that refuses CONFIG (an ACL, a managed service) is skipped.
        """
        if self._policy_checked:
            return
        self._policy_checked = True
        try:
            reply = yield Command(("CONFIG", "GET", "maxmemory-policy"))
        except Exception:
            return
        # CONFIG GET answers a flat list on RESP2 and a map on RESP3.
        values = list(reply.values()) if isinstance(reply, dict) else list(reply or [])[1::2]
        policy = _decode(values[0]) if values else ""
        if policy.startswith("allkeys"):
            warnings.warn(
                f"Redis maxmemory-policy is {policy!r}: under memory pressure the server may "
                f"evict keys of pool {self.name!r} (leases, the queue). Use 'noeviction' or a "
                "volatile-* policy; the pool's keys have no TTL.",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- acquire --------------------------------------------------------------

    def acquire(
        self,
        timeout: object,
        ttl: object,
        bind: object,
        blocking: object,
        *,
        cid: str,
        owner: object = None,
    ) -> Acquire:
        """Check the arguments and build an acquire: its steps, and the lease
        id under which the client's reader routes messages to it. ``cid`` is
        the client id of the reader (:class:`Hub`) that serves it."""
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
        wait = _timeout(timeout)
        ttl_ms = self._ttl_ms(ttl)
        bind_name = None if bind is None else _text("bind", bind, MAX_RESOURCE)
        holder = _owner(owner)
        lid = secrets.token_urlsafe(16)
        steps = self._acquire(lid, cid, wait, ttl_ms, bind_name, blocking, holder, None)
        # One flow for both kinds; a single acquire only ever returns one
        # lease (no wrapper generator: every level of `yield from` costs
        # each step of the hot path).
        return Acquire(lid=lid, steps=cast("Flow[Lease | None]", steps))

    def acquire_many(
        self,
        count: object,
        timeout: object,
        ttl: object,
        blocking: object,
        *,
        cid: str,
        owner: object = None,
    ) -> AcquireMany:
        """Same as :meth:`acquire`, for ``count`` resources at once, all or
        nothing: one request in the same queue, granted at the head when
        ``count`` resources are free at once (see lua/acquire_many.lua)."""
        number = _count(count)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
        wait = _timeout(timeout)
        ttl_ms = self._ttl_ms(ttl)
        holder = _owner(owner)
        lid = secrets.token_urlsafe(16)
        steps = self._acquire(lid, cid, wait, ttl_ms, None, blocking, holder, number)
        return AcquireMany(lid=lid, count=number, steps=cast("Flow[list[Lease] | None]", steps))

    def _acquire(
        self,
        lid: str,
        cid: str,
        timeout: float | None,
        ttl_ms: int,
        bind: str | None,
        blocking: bool,
        owner: str,
        count: int | None,
    ) -> Flow[Lease | list[Lease] | None]:
        """The one waiting flow, of ``acquire`` (``count`` None) and of
        ``acquire_many`` (the leases of ``count`` resources: it returns once
        it has all of them, from one reply or from ``count`` pushes)."""
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        if not blocking and deadline is None:
            # A non-blocking call never waits in line: give its retries the
            # same short budget as any single call (issue 8, item 1).
            deadline = started + RETRY_BUDGET
        alive_ms = ALIVE_MS
        own = (*self.keys, self.signal_key(cid))
        flag = "1" if blocking else "0"
        many: tuple[str | int, ...] = ()
        if count is None:
            enqueue: Call[State] = Call(
                "acquire",
                own,
                (lid, cid, ttl_ms, alive_ms, flag, bind or "", _ms(self.bind_ttl), owner),
                lambda reply: self._state("acquire", lid, reply),
            )
        else:
            many = ("", count)  # poll's probe (none) and count
            enqueue = Call(
                "acquire_many",
                own,
                (lid, cid, ttl_ms, alive_ms, flag, count, owner),
                lambda reply: self._state("acquire_many", lid, reply),
            )
        poll: Call[State] | None = None  # made when first needed: most acquires never wait
        # Grants of acquire_many pushed one lease at a time, by lease id.
        got: dict[str, Lease] = {}
        deleted = False
        # The reader's last error while it fails, if it does, when a wait ends.
        trouble: BaseException | None = None

        def attempt(call: Call[State]) -> Flow[State]:
            try:
                if not self.min_replicas:
                    return (yield from self._retrying(call, deadline=deadline))
                return (yield from self._look_confirmed(call, deadline))
            except Exception as exc:
                if blocking and timeout is not None and is_transient(exc):
                    # Out of time while the server was unreachable: the
                    # caller's timeout ran out; the error is its cause.
                    raise AcquireTimeout(self.name, time.monotonic() - started) from exc
                raise

        try:
            # A lost reply is retried with the same lease id: the script finds
            # the first attempt's ticket, so the requester keeps its place.
            state = yield from attempt(enqueue)
            if state == _BUSY:
                return None
            while True:
                if isinstance(state, (Lease, list)):
                    return state
                got.clear()
                if state == _GONE:
                    # The ticket left the queue without us (the pool's data was
                    # lost, or we looked dead for too long): queue again.
                    state = yield from attempt(enqueue)
                    continue
                assert isinstance(state, tuple)
                ticket, hint = state
                wake_at = None if hint is None else time.monotonic() + hint
                # Wait for a push; look again (poll) when the hint comes due or
                # the reader asks for it. The reader keeps us alive meanwhile.
                while True:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise AcquireTimeout(self.name, now - started) from trouble
                    limits = [t - now for t in (deadline, wake_at) if t is not None]
                    span = min(limits) if limits else None
                    if span is not None and span <= 0:
                        break
                    message = yield Wait(lid, span)
                    if message is None or isinstance(message, BaseException):
                        # Nothing came: the reply to a Wait that ran out is
                        # the reader's trouble, if it has any.
                        trouble = message
                        if deadline is not None and time.monotonic() >= deadline:
                            continue
                        break
                    seen = self._message(message, lid, ticket, count)
                    if isinstance(seen, Lease) and count is None:
                        if not self.min_replicas:
                            return seen
                        confirmed = yield from self._confirm_pushed(seen, deadline)
                        if confirmed is not None:
                            return confirmed
                        break  # taken back meanwhile: look again
                    if isinstance(seen, Lease):
                        # One script run pushed them all: the others follow,
                        # normally in the same batch. If one never comes (it
                        # ended before it was popped: its message went with
                        # it), a look within a heartbeat settles it: all the
                        # leases, or none and a place at the back.
                        got[seen.id] = seen
                        if len(got) == count:
                            leases = [got[many_id(lid, i)] for i in range(count)]
                            if not self.min_replicas:
                                return leases
                            all_confirmed = yield from self._confirm_pushed_many(leases, deadline)
                            if all_confirmed is not None:
                                return all_confirmed
                            break  # some taken back meanwhile: look again
                        soon = time.monotonic() + HEARTBEAT
                        wake_at = soon if wake_at is None else min(wake_at, soon)
                        continue
                    if isinstance(seen, float):
                        wake_at = time.monotonic() + seen
                    elif seen == DELETED:
                        deleted = True
                        raise AcquireTimeout(self.name, time.monotonic() - started)
                    elif seen == RECHECK:
                        break
                if poll is None:
                    poll = Call(
                        "poll",
                        own,
                        (lid, cid, alive_ms, *many),
                        lambda reply: self._state("poll", lid, reply),
                    )
                state = yield from attempt(poll)
        except GeneratorExit:
            raise
        except BaseException:
            # Giving up (timeout, cancellation, KeyboardInterrupt, an error):
            # leave the queue, and pass on a grant that raced in. One try: if
            # it fails, the ticket's liveness runs out and dispatch drops it.
            # A deleted pool holds no ticket: a cancel would only make keys.
            if deleted:
                raise
            cancel = Call("cancel", own, (lid, *many[1:]), lambda reply: _tagged("cancel", reply))
            with contextlib.suppress(Exception):
                yield from self._retrying(cancel, attempts=1)
            raise

    def _look_confirmed(self, call: Call[State], deadline: float | None) -> Flow[State]:
        """Run an acquire or poll call with ``min_replicas``: a grant in its
        reply counts only once confirmed, else it is released and
        :class:`NotReplicated` raised."""
        state, replicas = yield from self._retrying(self._confirmed(call), deadline=deadline)
        if isinstance(state, Lease) and replicas < self.min_replicas:
            raise (yield from self._give_back(state, replicas))
        if isinstance(state, list) and replicas < self.min_replicas:
            # acquire_many: all of them go back, and the first error is raised.
            errors = []
            for lease in state:
                errors.append((yield from self._give_back(lease, replicas)))
            raise errors[0]
        return state

    def _confirm_pushed_many(
        self, leases: list[Lease], deadline: float | None
    ) -> Flow[list[Lease] | None]:
        """:meth:`_confirm_pushed` for the leases of an acquire_many grant:
        all of them confirmed, or None if one is no longer this waiter's
        (its next look ends the others). A NotReplicated goes out to the
        flow, whose cancel ends every lease of the request."""
        confirmed = []
        for lease in leases:
            renewed = yield from self._confirm_pushed(lease, deadline)
            if renewed is None:
                return None
            confirmed.append(renewed)
        return confirmed

    def _confirm_pushed(self, lease: Lease, deadline: float | None) -> Flow[Lease | None]:
        """Confirm a grant pushed to this waiter by another client's script:
        a confirmed renew of it (see :func:`confirm_commands` for why that
        covers the grant). None if the grant is no longer this waiter's."""
        renew = self._confirmed(self._renew_call(lease, _ms(lease.ttl)))
        if deadline is None or deadline - time.monotonic() < RETRY_BUDGET:
            deadline = time.monotonic() + RETRY_BUDGET
        try:
            renewed, replicas = yield from self._retrying(renew, deadline=deadline)
        except LeaseLost:
            return None
        if replicas < self.min_replicas:
            raise (yield from self._give_back(renewed, replicas))
        return renewed

    # -- single-call operations ---------------------------------------------

    def release(self, lease: object, quarantine: object) -> Flow[bool]:
        held = self._check_lease(lease)
        q_ms = "" if quarantine is None else str(_ms(_seconds("quarantine", quarantine, minimum=0)))

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("release", reply)
            if rest or tag not in ("released", "lost"):
                raise _unexpected("release", reply)
            return tag == "released"

        return self._single(Call("release", self.keys, (held.id, held.ticket, q_ms, ""), parse))

    def renew(self, lease: object, ttl: object) -> Flow[Lease]:
        held = self._check_lease(lease)
        ttl_ms = _ms(_seconds("lease.ttl", held.ttl) if ttl is None else _seconds("ttl", ttl))
        call = self._renew_call(held, ttl_ms)
        if not self.min_replicas:
            return self._single(call)
        return self._renew_confirmed(call, held)

    def _renew_confirmed(self, call: Call[Lease], held: Lease) -> Flow[Lease]:
        renewed, replicas = yield from self._single(self._confirmed(call))
        if replicas < self.min_replicas:
            # The lease stays as the primary has it (renewed there).
            raise self._not_replicated(held, replicas, "renew")
        return renewed

    def _renew_call(self, held: Lease, ttl_ms: int) -> Call[Lease]:
        def parse(reply: Any) -> Lease:
            tag, rest = _tagged("renew", reply)
            if tag == "renewed" and len(rest) == 1:
                return attrs.evolve(held, expires_at=int(rest[0]) / 1000, ttl=ttl_ms / 1000)
            if tag == "lost" and not rest:
                raise LeaseLost(
                    self.name, held.resource, held.token, "expired, revoked or released"
                )
            raise _unexpected("renew", reply)

        return Call("renew", self.keys, (held.id, held.ticket, ttl_ms), parse)

    def extend(
        self, resources: object, capacity: object, priority: object, rate: object
    ) -> Flow[int]:
        names = _resources(resources)
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        if not 1 <= capacity <= 2**31:
            raise ValueError(f"capacity must be 1 to {2**31}, got {capacity}")
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise TypeError(f"priority must be a number, not {type(priority).__name__}")
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:  # also NaN, inf and 10**400
            raise ValueError(
                f"priority must be a finite number within +-{MAX_PRIORITY:.0e}, got {priority!r}"
            )
        score = repr(-priority) if isinstance(priority, float) else str(-priority)
        count, window_ms = 0, 0
        if rate is not None:
            if not isinstance(rate, (tuple, list)) or len(rate) != 2:
                raise TypeError("rate must be a (count, seconds) pair or None")
            count = rate[0]
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"rate count must be an int, not {type(count).__name__}")
            if not 1 <= count <= 1_000_000:
                raise ValueError(f"rate count must be 1 to 1000000, got {count}")
            window_ms = _ms(_seconds("rate seconds", rate[1]))
        return self._chunked("extend", names, (capacity, score, count, window_ms), "extended")

    def remove(self, resources: object, force: object) -> Flow[int]:
        names = _resources(resources)
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, not {type(force).__name__}")
        return self._chunked("remove", names, ("1" if force else "0",), "removed")

    def _chunked(
        self, op: str, names: list[str], head: tuple[str | int, ...], tag: str
    ) -> Flow[int]:
        def parse(reply: Any) -> int:
            got, rest = _tagged(op, reply)
            if got != tag or len(rest) != 1:
                raise _unexpected(op, reply)
            return int(rest[0])

        yield from self._check_policy()
        total = 0
        for start in range(0, len(names), CHUNK):
            call = Call(op, self.keys, head + tuple(names[start : start + CHUNK]), parse)
            total += yield from self._single(call)
        return total

    def bind(self, name: object, resource: object) -> Flow[None]:
        name = _text("name", name, MAX_RESOURCE)
        resource = _text("resource", resource, MAX_RESOURCE)

        def parse(reply: Any) -> None:
            tag, rest = _tagged("bind", reply)
            if tag == "unknown" and not rest:
                raise UnknownResource(self.name, resource)
            if tag != "bound" or rest:
                raise _unexpected("bind", reply)

        return self._single(Call("bind", self.keys, (name, resource, _ms(self.bind_ttl)), parse))

    def unbind(self, name: object) -> Flow[bool]:
        name = _text("name", name, MAX_RESOURCE)

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("unbind", reply)
            if tag != "unbound" or len(rest) != 1:
                raise _unexpected("unbind", reply)
            return int(rest[0]) == 1

        return self._single(Call("unbind", self.keys, (name,), parse))

    def status(self) -> Flow[PoolStatus]:
        yield from self._check_policy()
        return (yield from self._single(Call("status", self.keys, (), self._parse_status)))

    def _parse_status(self, reply: Any) -> PoolStatus:
        tag, rest = _tagged("status", reply)
        if tag != "status" or len(rest) < 7 or (len(rest) - 7) % 3:
            raise _unexpected("status", reply)
        now_us, exists, waiting, oldest_ms, bindings, hits, misses = (int(x) for x in rest[:7])
        now_ms = now_us // 1000
        rows = []
        for i in range(7, len(rest), 3):
            name, record = _decode(rest[i]), _decode(rest[i + 1])
            cap, score, used, _fence, state, until, _stamp, rc, rw, _rv = record.split("|")
            # The script wrote nothing: what a writer would handle first is
            # accounted for here. Leases past their deadline are not live; a
            # quarantine or throttle that ended is over.
            capacity, leases = int(cap), max(int(used) - int(rest[i + 2]), 0)
            parked = state in ("q", "t") and int(until) > now_ms
            if state == "d":
                shown = "draining"
            elif parked:
                shown = "quarantined"
            else:
                shown = "free" if leases < capacity else "leased"
            rows.append(
                ResourceStatus(
                    name=name,
                    capacity=capacity,
                    priority=0.0 - float(score),
                    leases=leases,
                    state=shown,
                    until=int(until) / 1000 if parked else None,
                    throttled=parked and state == "t",
                    rate=(int(rc), int(rw) / 1000) if int(rc) else None,
                )
            )
        rows.sort(key=lambda row: row.name)
        return PoolStatus(
            name=self.name,
            size=len(rows),
            free=sum(1 for row in rows if row.state == "free"),
            leased=sum(row.leases for row in rows),
            waiting=max(waiting, 0),
            resources=tuple(rows),
            bindings=bindings,
            bind_hits=hits,
            bind_misses=misses,
            server_time=now_us / 1e6,
            oldest_wait=oldest_ms / 1000,
            exists=exists == 1,
        )

    def leases(self) -> Flow[tuple[LeaseInfo, ...]]:
        def parse(reply: Any) -> tuple[LeaseInfo, ...]:
            tag, rest = _tagged("leases", reply)
            if tag != "leases" or not rest or (len(rest) - 1) % 5:
                raise _unexpected("leases", reply)
            out = []
            for i in range(1, len(rest), 5):
                resource, token, owner, granted_us, deadline_ms = (
                    _decode(x) for x in rest[i : i + 5]
                )
                out.append(
                    LeaseInfo(
                        resource=resource,
                        token=int(token),
                        owner=owner,
                        granted_at=int(granted_us) / 1e6,
                        expires_at=int(deadline_ms) / 1000,
                    )
                )
            out.sort(key=lambda info: (info.resource, info.granted_at, info.token))
            return tuple(out)

        return self._single(Call("leases", self.keys, (), parse))

    def stats(self) -> Flow[PoolStats]:
        def parse(reply: Any) -> PoolStats:
            tag, rest = _tagged("stats", reply)
            if tag != "stats" or not rest or (len(rest) - 1) % 2:
                raise _unexpected("stats", reply)
            fields = {_decode(rest[i]): int(rest[i + 1]) for i in range(1, len(rest), 2)}
            return stats_from_fields(self.name, fields, int(rest[0]) / 1e6)

        return self._single(Call("stats", self.keys, (), parse))

    def quarantine(self, resource: object, seconds: object) -> Flow[None]:
        resource = _text("resource", resource, MAX_RESOURCE)
        ms = _ms(_seconds("seconds", seconds))

        def parse(reply: Any) -> None:
            tag, rest = _tagged("quarantine", reply)
            if tag == "unknown" and not rest:
                raise UnknownResource(self.name, resource)
            if not ((tag == "quarantined" and len(rest) == 1) or (tag == "draining" and not rest)):
                raise _unexpected("quarantine", reply)

        yield from self._check_policy()
        return (yield from self._single(Call("quarantine", self.keys, (resource, ms), parse)))

    def delete(self, force: object) -> Flow[bool]:
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, not {type(force).__name__}")

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("delete", reply)
            if tag == "absent" and not rest:
                return False
            if tag == "busy" and len(rest) == 2:
                leases, waiting = int(rest[0]), int(rest[1])
                plural = "" if leases == 1 else "s"
                raise AllocatorError(
                    f"pool {self.name!r} is in use ({leases} live lease{plural}, "
                    f"{waiting} waiting): nothing was deleted; delete(force=True) revokes "
                    "the leases and turns the waiters away"
                )
            if tag == "deleted" and len(rest) == 2:
                _log.info(
                    "allocator: pool %r deleted (%d leases revoked, %d waiters turned away)",
                    self.name,
                    int(rest[0]),
                    int(rest[1]),
                )
                return True
            raise _unexpected("delete", reply)

        return self._single(Call("delete", self.keys, ("1" if force else "0",), parse))

    def gc(self) -> Flow[GCReport]:
        def parse(reply: Any) -> tuple[list[int], str, str, str, bool]:
            tag, rest = _tagged("gc", reply)
            if tag != "gc" or len(rest) != 10:
                raise _unexpected("gc", reply)
            counts = [int(x) for x in rest[:6]]
            pel, queue, res = (_decode(x) for x in rest[6:9])
            return counts, pel, queue, res, int(rest[9]) == 1

        yield from self._check_policy()
        totals = [0] * 6
        pel, queue, res = "0-0", "", "0"
        # Each step is bounded; the cursors walk the pending list, the queue
        # and the resources once, so the loop ends even while the pool is busy.
        for _ in range(100_000):
            call = Call("gc", self.keys, (pel, queue, res, GC_COUNT), parse)
            counts, pel, queue, res, more = yield from self._single(call)
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            if pel == "0-0" and queue == "" and res == "" and not more:
                break
        reclaimed, dropped, expired, unparked, orphans, repaired = totals
        return GCReport(
            reclaimed=reclaimed,
            dropped_waiters=dropped,
            expired_bindings=expired,
            unparked=unparked,
            orphans=orphans,
            repaired=repaired,
        )

    def lost_many(
        self,
        held: list[Lease],
        released: list[bool | BaseException],
        losses: list[LeaseLost | None],
    ) -> BaseException | None:
        """What the exit of ``lease_many`` raises, if anything: the first
        LeaseLost a keeper met, else a LeaseLost for the first lease whose
        release found it ended, else the first error a release raised (every
        release was tried). ``released`` holds each release's result or
        error; ``losses`` each keeper's LeaseLost or None."""
        lost = next((loss for loss in losses if loss is not None), None)
        if lost is not None:
            return lost
        for lease, result in zip(held, released, strict=True):
            if result is False:
                return LeaseLost(self.name, lease.resource, lease.token, "lost while held")
        return next((r for r in released if isinstance(r, BaseException)), None)

    def heartbeat(self, cid: str, probe: str) -> Call[tuple[str, bool, bool]]:
        """The client-level poll of a reader: keeps all of client ``cid``'s
        waiters alive, and returns the pool's epoch, whether waiter
        ``probe``'s ticket is still in the queue, and whether dead tickets
        are left at the head (then the reader beats again at once)."""

        def parse(reply: Any) -> tuple[str, bool, bool]:
            tag, rest = _tagged("poll", reply)
            if tag != "alive" or len(rest) != 3:
                raise _unexpected("poll", reply)
            return _decode(rest[0]), int(rest[1]) == 1, int(rest[2]) == 1

        own = (*self.keys, self.signal_key(cid))
        return Call("poll", own, ("", cid, ALIVE_MS, probe), parse)

    @staticmethod
    def recheck_after_beat(epoch: str, previous: str | None, probe_ok: bool, silent: float) -> bool:
        """After a reader's heartbeat: must every local waiter check its ticket?

        Yes if the pool's epoch changed (its data was lost), if the probed
        waiter's ticket vanished (the stream was deleted, a restart lost
        it), or if the reader was silent longer than the liveness window
        (the client may have been taken for dead and its tickets dropped).
        """
        changed = previous is not None and epoch != previous
        return changed or not probe_ok or silent > ALIVE

    def release_message(self, message: Any) -> Call[Any] | None:
        """For a grant that reached a client whose waiter had already left:
        the release that passes it on (None if ``message`` is no grant). Only
        if nobody claimed it: the waiter may have been handed it in a poll
        reply while the reader held the message."""
        kind, _, rest = _decode(message).partition("|")
        fields = rest.split("|", 5)
        if kind != "g" or len(fields) != 6:
            return None
        return Call("release", self.keys, (fields[0], fields[1], "", "1"), lambda reply: reply)

    @staticmethod
    def message_target(message: Any) -> str:
        """The lease id a signal-list message is for ('' if it names none)."""
        parts = _decode(message).split("|", 2)
        return parts[1] if len(parts) > 1 else ""


@attrs.frozen
class Acquire:
    """An acquire ready to be driven: the lease id its messages are routed
    by, and its steps."""

    lid: str
    steps: Flow[Lease | None] = attrs.field(repr=False)


@attrs.frozen
class AcquireMany:
    """An acquire_many ready to be driven: the request's id (its messages,
    one per lease, are routed by it: :func:`request_of`), and its steps."""

    lid: str
    count: int
    steps: Flow[list[Lease] | None] = attrs.field(repr=False)


# --------------------------------------------------------------------------
# The reader's decisions
# --------------------------------------------------------------------------


@attrs.define(eq=False)
class _Served:
    """A pool whose waiters a hub serves: its signal list for the hub's
    client, the waiters (probed in turn), grants delivered but not yet
    acknowledged, and the pool's epoch last seen."""

    pool: Pool
    key: str
    lids: collections.OrderedDict[str, None] = attrs.field(factory=collections.OrderedDict)
    acks: list[str] = attrs.field(factory=list)
    epoch: str | None = None


class Hub:
    """What the reader of one client (one per Redis client and process, and
    per event loop for asyncio) decides, for every pool it serves. Pure:
    the shells' readers carry out its plans with a thread or a task, and the
    sync one holds a lock around every call.

    One round of a reader: send the acknowledgements of the grants it
    delivered last round (``ZREM`` of their lease ids from each pool's
    ``pick``), block on the signal lists of the pools that have waiters,
    pop what else is there (``BLPOP`` then ``LPOP key BATCH`` per list, in
    one round trip), and route each message to the waiter it names. Once a
    heartbeat interval, a poll per pool keeps the client's waiters alive.
    """

    def __init__(self, heartbeat: float) -> None:
        #: The client's id in the pools' liveness marks and signal lists. A
        #: hub lives in one process: a forked child makes its own.
        self.cid = secrets.token_urlsafe(9)
        self.heartbeat = heartbeat
        self._waiters: dict[str, tuple[_Served, Any]] = {}
        self._served: dict[str, _Served] = {}
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_beat: float | None = None
        #: The error of the reader's last round while it fails (None once a
        #: round goes through): a waiter whose time runs out meanwhile
        #: chains it to its AcquireTimeout.
        self.trouble: BaseException | None = None
        self._retrier = Retrier("waiting-list reader")
        self._refusals = 0
        self._failing_since: float | None = None

    # -- waiters ------------------------------------------------------------

    def register(self, pool: Pool, lid: str, inbox: Any) -> None:
        key = pool.signal_key(self.cid)
        served = self._served.get(key)
        if served is None:
            served = self._served[key] = _Served(pool, key)
        served.lids[lid] = None
        self._waiters[lid] = (served, inbox)

    def unregister(self, lid: str) -> None:
        # The pool stays known (a few strings per pool): a grant popped
        # after its waiter left must still be released.
        entry = self._waiters.pop(lid, None)
        if entry is not None:
            entry[0].lids.pop(lid, None)

    def inbox(self, lid: str) -> Any:
        return self._waiters[lid][1]

    @property
    def idle(self) -> bool:
        """Nothing to wait for and nothing to acknowledge: the reader stops."""
        return not self._waiters and not any(s.acks for s in self._served.values())

    # -- a round ------------------------------------------------------------

    def beat_in(self, now: float) -> float:
        """Seconds until the next heartbeat is due (<= 0: now)."""
        if self._last_beat is None:
            self._last_beat = now
        return self.heartbeat - (now - self._last_beat)

    def beats(self) -> list[tuple[str, Call[tuple[str, bool, bool]]]]:
        """The heartbeat of each pool with waiters, probing one of them in turn."""
        calls = []
        for served in self._served.values():
            if served.lids:
                probe = next(iter(served.lids))
                served.lids.move_to_end(probe)
                calls.append((served.key, served.pool.heartbeat(self.cid, probe)))
        return calls

    def beaten(
        self, now: float, results: list[tuple[str, tuple[str, bool, bool]]]
    ) -> tuple[list[Any], bool]:
        """After the heartbeats: the inboxes to tell to look again, and
        whether to beat again at once (dead tickets left at a pool's head).

        A pool's waiters look again if its epoch changed (its data was
        lost), if the probed waiter's ticket vanished, or if the reader was
        silent past the liveness window (its client may have been taken for
        gone, its tickets dropped, its grants taken back)."""
        silent = self._silent(now)
        self._last_beat = now
        inboxes: list[Any] = []
        again = False
        for key, (epoch, probe_ok, more) in results:
            served = self._served.get(key)
            if served is None:
                continue
            if Pool.recheck_after_beat(epoch, served.epoch, probe_ok, silent):
                inboxes += [self._waiters[lid][1] for lid in served.lids]
            served.epoch = epoch
            again = again or more
        return inboxes, again

    def all_inboxes(self) -> list[Any]:
        return [inbox for _, inbox in self._waiters.values()]

    # -- trouble ------------------------------------------------------------

    def failed(self, error: BaseException) -> tuple[float, list[Any]]:
        """A round (or a heartbeat) failed with ``error``: how long the
        reader pauses, and the inboxes of the waiters that must look by
        themselves.

        A transient error (the server unreachable, failing over) is retried
        with jittered backoff while the waiters wait; one whose time runs
        out meanwhile chains :attr:`trouble` to its AcquireTimeout. Any
        other error (a wrong password, an ACL refusal, a bug) is not the
        reader's to retry for ever: every waiter looks by itself, so that
        its own call raises the error at once, and the reader backs off
        until they have left or the error has passed."""
        self.trouble = error
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if not self._waiters and now - self._failing_since > ACK_GIVE_UP:
            # Only acknowledgements left, and too late to matter: stop.
            for served in self._served.values():
                served.acks.clear()
            return 0.0, []
        delay = self._retrier.next_delay(error)
        if delay is not None:
            return delay, []
        self._refusals += 1
        _log.warning("allocator: the waiting-list reader failed", exc_info=error)
        pause = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self._refusals, 16))
        return random.uniform(pause / 2, pause), self.all_inboxes()

    def succeeded(self) -> None:
        """A round went through."""
        if self.trouble is not None:
            self.trouble = None
            self._refusals = 0
            self._failing_since = None
            self._retrier.succeeded()

    def plan(self) -> tuple[list[tuple[str, list[str]]], list[str]]:
        """This round's acknowledgements (``pick`` key, lease ids) and the
        signal lists to block on."""
        acks = [(s.pool.keys[PICK], list(s.acks)) for s in self._served.values() if s.acks]
        keys = [s.key for s in self._served.values() if s.lids]
        return acks, keys

    def acked(self, acks: list[tuple[str, list[str]]]) -> None:
        """The acknowledgements of ``plan`` reached the server."""
        sent = {pick: set(lids) for pick, lids in acks}
        for served in self._served.values():
            done = sent.get(served.pool.keys[PICK])
            if done:
                served.acks = [lid for lid in served.acks if lid not in done]

    def route(self, key: Any, message: Any, now: float) -> tuple[Any, Any, Call[Any] | None]:
        """Where a popped message goes: ``(inbox, item, None)`` to put
        ``item`` in its waiter's inbox, ``(None, None, call)`` to release a
        grant whose waiter left (only while nobody claimed it), or
        ``(None, None, None)`` to drop it. A delivered grant is acknowledged
        in the next round. ``now``: the monotonic time it was popped."""
        served = self._served.get(_decode(key))
        if served is None:
            return None, None, None
        pool = served.pool
        text = _decode(message)
        lid = Pool.message_target(text)
        grant = text.startswith("g|")
        # A lease of acquire_many goes to the waiter of its request.
        entry = self._waiters.get(lid) or self._waiters.get(request_of(lid))
        if entry is not None and entry[0] is served:
            if grant and self._silent(now) > ALIVE:
                # Popped before a silence past the liveness window: the grant
                # may have been taken back since. The waiter asks (a poll
                # hands it over if it is still its own).
                return entry[1], RECHECK, None
            if grant:
                self._remember(served, lid)
            elif text.startswith("d|"):
                # Its pool was deleted: no more heartbeats for this waiter,
                # which would make the pool's keys again before it leaves.
                served.lids.pop(lid, None)
            return entry[1], message, None
        if grant:
            if lid in self._recent:
                # Delivered already: this is a copy put back after a lost
                # reply. Acknowledge it again; never release it.
                served.acks.append(lid)
                return None, None, None
            return None, None, pool.release_message(text)
        return None, None, None

    def _silent(self, now: float) -> float:
        return 0.0 if self._last_beat is None else now - self._last_beat

    # -- the loop -------------------------------------------------------------

    def rounds(self, clock: Callable[[], float]) -> Generator[ReaderStep, Any, None]:
        """A reader's loop, for both shells: it yields each step for the
        shell to carry out (its thread or task, its connection) and is sent
        the step's result, or thrown the error of a Beat, an Exchange or a
        release. It ends when nothing is left to wait for or acknowledge.
        The sync shell holds its lock while the loop runs, and not while a
        step is carried out. ``clock``: monotonic seconds."""
        while not self.idle:
            try:
                if self.beat_in(clock()) <= 0:
                    results = yield Beat(self.beats())
                    inboxes, again = self.beaten(clock(), results)
                    if inboxes:
                        yield Deliver([(inbox, RECHECK) for inbox in inboxes], [])
                    if again:
                        continue
                acks, keys = self.plan()
                popped = yield Exchange(acks, keys, max(0.01, self.beat_in(clock())))
                self.succeeded()
                self.acked(acks)
                now = clock()
                items: list[tuple[Any, Any]] = []
                releases: list[Call[Any]] = []
                for key, message in popped:
                    inbox, item, release = self.route(key, message, now)
                    if inbox is not None:
                        items.append((inbox, item))
                    elif release is not None:
                        releases.append(release)
                if items or releases:
                    yield Deliver(items, releases)
            except Exception as exc:
                if self.idle:  # its client was closed under it, say
                    return
                pause, inboxes = self.failed(exc)
                if inboxes:
                    yield Deliver([(inbox, RECHECK) for inbox in inboxes], [])
                yield Sleep(pause)

    def _remember(self, served: _Served, lid: str) -> None:
        served.acks.append(lid)
        self._recent[lid] = None
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)


#: Positions in Pool.keys.
PICK = KEY_SUFFIXES.index("pick")
#: How much longer than its blocking time a reader waits for its round's
#: reply before it takes the connection for dead (a lost reply costs no
#: grant: one not acknowledged is put back on its list, see prelude.lua).
READ_SLACK = 5.0


def round_commands(
    acks: list[tuple[str, list[str]]], keys: list[str], block: float
) -> list[tuple[str | int, ...]]:
    """The commands of a reader's round (see :class:`Hub`), for one pipeline."""
    commands: list[tuple[str | int, ...]] = [("ZREM", pick, *lids) for pick, lids in acks]
    if keys:
        commands.append(("BLPOP", *keys, f"{block:.3f}"))
        commands += [("LPOP", key, BATCH) for key in keys]
    return commands


def round_replies(
    commands: list[tuple[str | int, ...]], replies: list[Any]
) -> list[tuple[Any, Any]]:
    """The messages a round popped, as ``(key, message)`` pairs in order.
    An error reply (after all replies were read) is raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    at = next((i for i, c in enumerate(commands) if c[0] == "BLPOP"), None)
    if at is None:
        return []
    keys = [c[1] for c in commands[at + 1 :]]
    return popped(replies[at], list(zip(keys, replies[at + 1 :], strict=True)))


def popped(first: Any, rest: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """A BLPOP reply (``[key, message]`` or None) and the LPOP replies after
    it (``(key, [message, ...] or None)``), as ``(key, message)`` pairs."""
    if not first:
        return []
    out = [(first[0], first[1])]
    for key, messages in rest:
        out += [(key, message) for message in messages or ()]
    return out
