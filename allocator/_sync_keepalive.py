# generated from allocator/_async_keepalive.py by docs/scripts/async_to_sync.py: do not edit
"""The keepalive of a ``lease()`` block (``keepalive=True``): its lease
renewed every ttl/3 until the block ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._acompat import Pause, Worker
from ._values import Lease
from .errors import LeaseLost

if TYPE_CHECKING:
    from ._sync import FairAllocator

__all__ = ["Keeper"]


class Keeper:
    """Renews a lease every ttl/3 from a daemon thread until stopped."""

    def __init__(self, owner: FairAllocator, lease: Lease) -> None:
        self._owner = owner
        self._lease = lease
        self._lost: LeaseLost | None = None
        self._worker = Worker(self._run, f"allocator-keepalive-{lease.resource}")

    def _run(self, pause: Pause) -> None:
        while pause(self._lease.ttl / 3):
            try:
                self._lease = self._owner.renew(self._lease)
            except LeaseLost as lost:
                self._lost = lost
                return
            except Exception:  # a transport error: try again next interval
                continue

    def stop(self) -> LeaseLost | None:
        """Stop renewing; returns the LeaseLost a renewal met, if any."""
        self._worker.stop()
        return self._lost
