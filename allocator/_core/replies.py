"""Reading script replies and signal-list messages: every reply of a script
is read through here, and anything out of shape raises (Lua and Python out
of step)."""

from __future__ import annotations

import math
from typing import Any

from redis.exceptions import ResponseError

from .._values import Lease, PoolStats
from ..errors import AllocatorError, CorruptPool


def _decode(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    return str(value)


def _stream_id(text: str) -> tuple[int, int]:
    """A stream id ``ms-seq`` as a pair that orders as the stream does."""
    first, _, second = text.partition("-")
    try:
        return int(first), int(second)
    except ValueError:
        return -1, -1


def server_refusal(error: BaseException) -> AllocatorError | None:
    """The library's error for a script's refusal (lua/README.md, "Trust"):
    ``ALLOCATOR-CORRUPT <key>: <what>`` is a :class:`CorruptPool` naming the
    pool and the key; ``ALLOCATOR-ARG <op>: ...``, an argument the Python
    checks let through and the server refused, is a bug (or Lua and Python
    out of step), an :class:`AllocatorError` saying so. None for any other
    error."""
    if not isinstance(error, ResponseError):
        return None
    text = str(error)
    if text.startswith("ALLOCATOR-CORRUPT "):
        key, _, detail = text[len("ALLOCATOR-CORRUPT ") :].partition(": ")
        return CorruptPool(pool_of_key(key), key, detail)
    if text.startswith("ALLOCATOR-ARG "):
        return AllocatorError(
            f"the server refused an argument ({text[len('ALLOCATOR-ARG ') :]}): "
            "Lua and Python out of step?"
        )
    return None


def pool_of_key(key: str) -> str:
    """The pool name in one of its keys (``<prefix>:{<name>}:<suffix>``),
    unescaped as the keys escape it; the key itself if it has no tag."""
    start, end = key.find("{"), key.rfind("}:")
    if start < 0 or end < start:
        return key
    name = key[start + 1 : end]
    return name.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


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


#: What Pool._message makes of a ``d|<lease id>`` notice: the pool was
#: deleted while this requester waited.
DELETED = "d|"


def many_id(lid: str, index: int) -> str:
    """The lease id of resource ``index`` (from 0) of the acquire_many
    request ``lid`` (lua/prelude_many.lua ``P.many_id``): ``lid`` itself, then
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


#: Upper bounds (seconds) of the wait histogram's buckets, as the scripts
#: keep them (P:count_wait in lua/prelude_resources.lua, in ms): field ``w<i>`` of the
#: ``stats`` hash counts the grants whose wait fell in bucket i (1-based),
#: ``w0`` those beyond the last bound.
WAIT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


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
        quarantined_on_release=fields.get("qr", 0),
        quarantined_by_operator=fields.get("qo", 0),
        wait_seconds=tuple(buckets),
        wait_seconds_sum=fields.get("ws", 0) / 1000,
        server_time=server_time,
    )
