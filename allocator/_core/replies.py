"""Reading script replies: every reply of a script is read through here,
and anything out of shape raises (Lua and Python out of step). The
messages of the signal lists are read in :mod:`.messages`."""

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
