"""Start and stop a private ``redis-server`` (tests, benchmark, demo ``--server``).

The server listens on a free loopback port, keeps its files in a temporary
directory, and is stopped (and the directory removed) when the context ends.
Persistence is off unless ``appendonly=True``; the restart tests turn it on and
call :meth:`RedisServer.restart` to check that state survives.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from types import TracebackType

__all__ = ["RedisServer", "find_redis_server", "free_port"]


def find_redis_server() -> str | None:
    """The ``redis-server`` executable on PATH, or None."""
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A throw-away redis-server process; use as a context manager."""

    def __init__(
        self,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        executable: str | None = None,
    ) -> None:
        exe = executable or find_redis_server()
        if exe is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.executable = exe
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="allocator-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            os.path.join(self.dir, "redis.log"),
        ]
        if self.appendonly:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        return argv + self.extra_args

    def start(self, timeout: float = 10.0) -> RedisServer:
        self._proc = subprocess.Popen(
            self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout}s: {self.log_tail()}")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGKILL if ``kill`` (nothing flushed), else SIGTERM."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port and directory."""
        self.stop(kill=kill)
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
