"""The ``allocator`` command: the tools above the library.

One module per command group: :mod:`.views` (``pools``, ``status``,
``watch``), :mod:`.admin` (``extend``, ``remove``, ``quarantine``,
``delete``, ``gc``), :mod:`.serve` (``metrics``), :mod:`.demo` and the
benchmark package :mod:`.bench`. :mod:`._common` holds what they share: the
connection (a Redis Cluster is detected), the options, the error lines.

Nothing in the library imports this package. Its dependencies come with the
``cli`` extra; without them, ``allocator`` says in one line what to install.

``main(argv) -> int`` runs one command in-process (the tests call it so):
0 on success, 1 for a user's mistake (a server that is down, a refused
password, an unknown pool, a bad argument value), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

__all__ = ["main"]

#: The command groups, by module, in the order of ``allocator --help``.
GROUPS = ("views", "admin", "serve", "demo", "bench")

INSTALL_HINT = (
    "allocator: the command line needs the 'cli' extra "
    "(rich, prometheus-client, fakeredis): pip install 'redis-fair-allocator[cli]'"
)


def _parser() -> argparse.ArgumentParser:
    from allocator import __version__

    parser = argparse.ArgumentParser(
        prog="allocator",
        description="See and steer FIFO-fair resource pools on Redis.",
        epilog="Every command that talks to Redis takes --url (default $REDIS_URL, else "
        "redis://127.0.0.1:6379/0) and --prefix (default $ALLOCATOR_PREFIX, else alloc).",
    )
    parser.add_argument("--version", action="version", version=f"allocator {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        importlib.import_module(f"allocator.cli.{group}").register(commands)
    return parser


def _missing() -> list[str]:
    return [m for m in ("rich", "prometheus_client") if importlib.util.find_spec(m) is None]


def main(argv: list[str] | None = None) -> int:
    """Run the ``allocator`` command line; returns the exit status."""
    if _missing():
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    from ._common import run_command

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, a usage error
        return int(exit_.code or 0)
    return run_command(args)
