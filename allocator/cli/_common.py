"""What the commands share: the connection options, the connection itself (a
Redis Cluster is detected), human times, and turning errors into one line."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import redis
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    RedisError,
    ResponseError,
)

from allocator import FairAllocator
from allocator.errors import AllocatorError

__all__ = [
    "CommandError",
    "Connection",
    "Terminated",
    "UsageError",
    "add_connection",
    "ago",
    "connect",
    "console",
    "is_cluster",
    "iso",
    "log_to_stderr",
    "run_command",
    "safe_url",
    "sigterm_ends",
]

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class CommandError(Exception):
    """A server or pool error a user can mend: printed as one line, exit status 1."""


class UsageError(CommandError):
    """Options that do not go together: printed as one line, exit status 2."""


class Terminated(BaseException):
    """SIGTERM arrived (a service manager stopping a long-running command):
    a normal end, exit status 0. A BaseException, like KeyboardInterrupt, so
    that no ``except Exception`` on the way swallows it."""


@contextlib.contextmanager
def sigterm_ends() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` (which
    :func:`run_command` turns into exit status 0); the previous handler is
    put back after it. Off the main thread (a test), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def log_to_stderr() -> Iterator[None]:
    """The library's log (logger ``allocator``, INFO and up) on stderr, one
    line a message, while the block runs: what a long-running command has to
    say about the server (the metrics exporter's "cannot read")."""
    logger = logging.getLogger("allocator")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def add_connection(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--prefix``, read from the environment when left out."""
    parser.add_argument(
        "--url",
        type=non_empty,
        default=None,
        help="Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379/0); a Redis "
        "Cluster is detected by itself",
    )
    parser.add_argument(
        "--prefix",
        type=non_empty,
        default=None,
        help="key prefix of the pools (default: $ALLOCATOR_PREFIX, else alloc)",
    )


def url_of(args: argparse.Namespace) -> str:
    return _setting(args.url, "REDIS_URL", DEFAULT_URL)


def prefix_of(args: argparse.Namespace) -> str:
    return _setting(getattr(args, "prefix", None), "ALLOCATOR_PREFIX", "alloc")


def _setting(given: str | None, variable: str, default: str) -> str:
    """An option, else its environment variable, else the default. A
    variable that is set but empty is a mistake (an unset ``$VAR`` in a
    script), not a wish for the default: it would aim at a server or a
    prefix nobody meant."""
    if given is not None:
        return given
    value = os.environ.get(variable)
    if value is None:
        return default
    if not value:
        raise CommandError(f"{variable} is set but empty: give a value or unset it")
    return value


def safe_url(url: str) -> str:
    """The URL with its password (and a token in the query) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"{user}@{host}"
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(
        f"{key}={'***' if key.lower() in ('password', 'pass') else value}" for key, value in pairs
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


class Connection:
    """A client on ``url`` (a ``RedisCluster`` when the server is a cluster
    node), the prefix, and the URL to show (without its password)."""

    def __init__(self, client: Any, url: str, prefix: str, cluster: bool) -> None:
        self.client = client
        self.url = url
        self.shown = safe_url(url)
        self.prefix = prefix
        self.cluster = cluster

    def pool(self, name: str) -> FairAllocator:
        return FairAllocator(self.client, name, prefix=self.prefix)

    def pools(self) -> list[str]:
        return FairAllocator.pools(self.client, prefix=self.prefix)

    def existing(self, name: str) -> FairAllocator:
        """The pool, or CommandError if no key of it exists."""
        pool = self.pool(name)
        if not pool.status().exists:
            raise CommandError(f"no pool named {name!r} (prefix {self.prefix!r}) on {self.shown}")
        return pool

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def connect(args: argparse.Namespace) -> Connection:
    """Connect as ``--url`` says; a server with ``cluster_enabled`` gets the
    cluster client (reads of the cluster's layout need no extra step)."""
    url, prefix = url_of(args), prefix_of(args)
    options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 10}
    _check_database(url)
    try:
        client: Any = redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise CommandError(f"bad --url {safe_url(url)}: {exc}") from None
    cluster = is_cluster(client)
    if cluster:
        client.close()
        from redis.cluster import RedisCluster

        client = RedisCluster.from_url(url, **options)
    return Connection(client, url, prefix, cluster)


def _check_database(url: str) -> None:
    """Refuse a database in the URL's path that is not a number: redis-py
    takes ``redis://host:6379/abc`` for database 0, which would aim at a
    database nobody meant."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return  # redis-py says what is wrong
    if parts.scheme not in ("redis", "rediss"):
        return  # unix://: the path is the socket's
    db = urllib.parse.unquote(parts.path).strip("/")
    if db and not db.isdecimal():
        raise CommandError(
            f"bad --url {safe_url(url)}: the database after the last / must be a number, not {db!r}"
        )


def is_cluster(client: Any) -> bool:
    """Whether the server of a plain client is a Redis Cluster node."""
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except (NoPermissionError, ResponseError) as exc:
        if not _refused(exc):
            raise
    # A user without INFO (a monitoring role): ask the cluster itself.
    try:
        client.execute_command("CLUSTER", "MYID")
    except ResponseError:
        return False
    return True


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, NoPermissionError) or "NOPERM" in str(exc)


def describe(exc: BaseException, shown_url: str) -> str:
    """One line for an error a user can mend, never with a password in it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (AuthenticationError, AuthorizationError)) or any(
        word in text for word in ("WRONGPASS", "NOAUTH", "invalid password", "invalid username")
    ):
        return f"Redis at {shown_url} refused the login (wrong user or password): {text}"
    if _refused(exc):
        return f"Redis at {shown_url} refused a command for this user (ACL): {text}"
    if isinstance(exc, redis.ConnectionError):
        return f"cannot reach Redis at {shown_url}: {text}"
    if isinstance(exc, redis.TimeoutError):
        return f"Redis at {shown_url} did not answer in time: {text}"
    if isinstance(exc, AllocatorError):
        return text
    return f"{type(exc).__name__}: {text}"


def run_command(args: argparse.Namespace) -> int:
    """Run the command ``args.run`` names. Errors become one line on stderr
    and the exit status of :data:`allocator.cli.EXIT_CODES`; Ctrl-C (130),
    SIGTERM where a command allows it (0) and a closed pipe end quietly."""
    handler: Callable[[argparse.Namespace], int] = args.run
    shown = ""
    try:
        shown = safe_url(url_of(args)) if hasattr(args, "url") else ""
        return int(handler(args))
    except UsageError as exc:
        _error(str(exc))
        return 2
    except CommandError as exc:
        _error(str(exc))
    except (RedisError, AllocatorError) as exc:
        _error(describe(exc, shown))
    except (ValueError, TypeError) as exc:
        # The library's argument checks (before any I/O): a bad value.
        _error(f"bad argument: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 0
    except BrokenPipeError:
        # `allocator status x | head`: the reader left. Nothing more to
        # say; stdout is pointed at /dev/null so the exit flush is quiet.
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    return 1


def console() -> Any:
    """A rich console: on a terminal, its width; elsewhere (a pipe, a file,
    a test) wide enough that no table is cut."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _error(text: str) -> None:
    print(f"allocator: {text}", file=sys.stderr)


# -- times --------------------------------------------------------------------


def ago(seconds: float) -> str:
    """A duration for people: ``40 ms``, ``2.4 s``, ``12 s``, ``3 min``, ``2 h 5 min``, ``3 d``."""
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 10:
        text = f"{s:.1f} s"
    elif s < 120:
        text = f"{s:.0f} s"
    elif s < 3600:
        text = f"{s // 60:.0f} min"
    elif s < 48 * 3600:
        hours, rest = divmod(s, 3600)
        text = f"{hours:.0f} h {rest // 60:.0f} min"
    else:
        text = f"{s / 86400:.0f} d"
    return sign + text


def iso(epoch: float) -> str:
    """Server time (seconds since the epoch) as ISO 8601, UTC."""
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).isoformat(
        timespec="milliseconds"
    )


def non_empty(text: str) -> str:
    """An option's text, refused if empty (an unset ``"$VAR"`` on the line)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``)."""
    bounds = f"{low} or more" if high is None else f"{low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
        return value

    return parse


positive_int = whole(1)
port = whole(0, 65535)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value
