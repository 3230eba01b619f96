"""Argument checks: every argument a caller gives is checked here, before
any I/O, and a bad one raises ``ValueError`` or ``TypeError`` naming it.
The bounds match the server's own checks (lua/prelude_checks.lua)."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable

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


#: The longest event log a pool may keep (set_events).
MAX_EVENTS = 10_000_000


MAX_TOKEN = 2**63 - 1


def _int(name: str, value: object, low: int, high: int) -> int:
    """An int from ``low`` to ``high``, as a plain ``int``: an int subclass
    (``IntEnum``, ``IntFlag``) is an int to its caller, so it is taken for its
    value here, rather than sent on as itself (redis-py writes it by its
    ``repr``, which the server would refuse after the call had started)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{name} must be {low} to {high}, got {_shown(number)}")
    return number


def _shown(value: float) -> str:
    """A number for an error message. Python refuses to write an int of
    more than 4,300 digits (its int->str limit): such an error would not
    name the argument. Any int beyond 64 bits is far out of every bound."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


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


def _count(count: object) -> int:
    return _int("count", count, 1, MAX_COUNT)


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
