"""The ``allocator`` command: the tools above the library.

One module per command group: :mod:`.views` (``pools``, ``status``,
``watch``), :mod:`.admin` (``extend``, ``remove``, ``quarantine``,
``delete``, ``gc``), :mod:`.events` (``events``), :mod:`.serve` (``metrics``), :mod:`.demo` and the
benchmark package :mod:`.bench`. :mod:`._common` holds what they share: the
connection (a Redis Cluster is detected), the options, the error lines.

Nothing in the library imports this package. Its dependencies come with the
``cli`` extra; without them, ``allocator`` says in one line what to install.

``main(argv) -> int`` runs one command in-process (the tests call it so)
and returns its exit status, as :data:`EXIT_CODES` lists them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

__all__ = ["EXIT_CODES", "main"]

#: The command groups, by module, in the order of ``allocator --help``.
GROUPS = ("views", "admin", "events", "serve", "demo", "bench")

#: The exit status of every command (``allocator --help`` shows it).
EXIT_CODES = """\
exit status, every command:
  0    done; demo: every check held; bench: every target met.
       SIGTERM ends metrics, watch, events --follow and gc --every with 0
       (gc --every: Ctrl-C too)
  1    a server or pool error: Redis down or refusing the login or a command,
       a bad --url, no such pool or resource, a pool in use;
       demo: a check failed; bench: a target missed or a scenario failed
  2    usage: a missing or bad option or argument
  130  interrupted (Ctrl-C)"""

INSTALL_HINT = (
    "allocator: the command line needs the 'cli' extra "
    "(rich, prometheus-client, fakeredis): pip install 'redis-fair-allocator[cli]'"
)


def _version() -> str:
    from allocator import __version__

    return f"allocator {__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocator",
        description="See and steer FIFO-fair resource pools on Redis.",
        epilog="Every command that talks to Redis takes --url (default $REDIS_URL, else\n"
        "redis://127.0.0.1:6379/0) and --prefix (default $ALLOCATOR_PREFIX, else alloc).\n\n"
        + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=_version(), help="print the version and exit"
    )
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="what to do (COMMAND --help: its options)",
    )
    for group in GROUPS:
        importlib.import_module(f"allocator.cli.{group}").register(commands)
    return parser


def _missing() -> list[str]:
    return [m for m in ("rich", "prometheus_client") if importlib.util.find_spec(m) is None]


def main(argv: list[str] | None = None) -> int:
    """Run the ``allocator`` command line; returns the exit status."""
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        # Needs nothing of the extra: a plain install answers it too.
        print(_version())
        return 0
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
