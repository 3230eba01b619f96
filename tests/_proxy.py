"""A TCP proxy in front of a Redis server that can cut the network without
closing anything: a partition, as a holder sees it (its sockets stay open,
nothing it sends arrives, nothing comes back), and as the server sees it
(the proxy's connection to it stays open: the holder looks connected)."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from typing import Any


class PartitionProxy:
    """Forwards each connection to the server of ``url`` until
    :meth:`partition`; after that, what either side sends is dropped, and
    every socket stays open until :meth:`close`."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def partition(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """Forward again (what was sent meanwhile stays lost)."""
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> PartitionProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            try:
                far = socket.create_connection(self._upstream)
            except OSError:
                near.close()
                return
            with self._lock:
                if self._closed.is_set():  # closed meanwhile: these too
                    near.close()
                    far.close()
                    return
                self._sockets += [near, far]
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                if not self._cut.is_set():
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                return
            if self._cut.is_set():
                continue  # lost on the way; the sender is none the wiser
            try:
                dst.sendall(data)
            except OSError:
                return
