# the source of allocator/_sync_keepalive.py: run docs/scripts/async_to_sync.py after an edit
"""The keepalive of a ``lease()`` block (``keepalive=True``): its lease
renewed every ttl/3 until the block ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._acompat import APause, AWorker
from ._values import Lease
from .errors import LeaseLost

if TYPE_CHECKING:
    from ._async import AsyncFairAllocator

__all__ = ["Keeper"]


class Keeper:
    """Renews a lease every ttl/3 from a task until stopped."""

    def __init__(self, owner: AsyncFairAllocator, lease: Lease) -> None:
        self._owner = owner
        self._lease = lease
        self._lost: LeaseLost | None = None
        self._worker = AWorker(self._run, f"allocator-keepalive-{lease.resource}")

    async def _run(self, pause: APause) -> None:
        while await pause(self._lease.ttl / 3):
            try:
                self._lease = await self._owner.renew(self._lease)
            except LeaseLost as lost:
                self._lost = lost
                return
            except Exception:  # a transport error: try again next interval
                continue

    async def stop(self) -> LeaseLost | None:
        """Stop renewing; returns the LeaseLost a renewal met, if any."""
        await self._worker.stop()
        return self._lost
