"""Does the server speak TLS? One question the shells ask, with I/O of its own.

A client that connects in plain text to a port that speaks TLS sees its
connection reset while it reads the server's first reply: to redis-py that
is a ``ConnectionError``, which passes for a transient one, so a call would
retry it until its deadline, and a call without one for ever. When such an
error comes from a plain-text client, :func:`refine` asks the server once
(a TLS handshake of its own, bounded by :data:`PROBE_TIMEOUT`, the answer
kept for :data:`REMEMBER` seconds per address) and, if it speaks TLS,
returns a :class:`~allocator._core.retry.PlainTextToTLS`, which no retry
mends; the shell raises it from the error seen.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any

from ._core.retry import PlainTextToTLS, reset_by_peer

__all__ = ["refine"]

#: How long the handshake of the probe may take.
PROBE_TIMEOUT = 0.25
#: How long an answer is kept per address, so that a client that fails
#: again and again asks once.
REMEMBER = 10.0

_answers: dict[tuple[str, int], tuple[float, bool]] = {}
_lock = threading.Lock()


def _address(client: Any) -> tuple[str, int] | None:
    """The host and port a plain-text client connects to; None for a TLS
    client, a Unix socket, a Sentinel-managed or cluster client (whose
    address is not the pool's), or anything not known."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    cls = getattr(pool, "connection_class", None)
    if not isinstance(kwargs, dict) or cls is None:
        return None
    if "ssl" in cls.__name__.lower() or "sentinel" in cls.__name__.lower():
        return None
    if "path" in kwargs or getattr(pool, "service_name", None) is not None:
        return None
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    if not isinstance(host, str) or not isinstance(port, int):
        return None
    return host, port


def speaks_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the server at ``host:port`` completes a TLS handshake (its
    certificate is not checked: the question is only which protocol it
    speaks). False when it cannot tell (no answer, refused, plain text)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.settimeout(timeout)
            return tls.version() is not None
    except ssl.SSLError as error:
        # An alert from the server is TLS too (it refused this client).
        return "ALERT" in str(error).upper()
    except (OSError, ValueError):
        return False


def refine(client: Any, error: BaseException) -> BaseException:
    """``error`` itself, or a :class:`PlainTextToTLS` to raise from it where a
    plain-text ``client``'s connection was reset by a server that speaks
    TLS (blocking, at most :data:`PROBE_TIMEOUT` per address every
    :data:`REMEMBER` seconds; the asyncio shell runs it in a thread)."""
    if not reset_by_peer(error):
        return error
    address = _address(client)
    if address is None:
        return error
    now = time.monotonic()
    with _lock:
        known = _answers.get(address)
    if known is not None and now - known[0] < REMEMBER:
        tls = known[1]
    else:
        tls = speaks_tls(*address)
        with _lock:
            _answers[address] = (now, tls)
    if not tls:
        return error
    return PlainTextToTLS(
        f"the server at {address[0]}:{address[1]} speaks TLS and this client connects "
        "in plain text: use a rediss:// URL (or ssl=True)"
    )
