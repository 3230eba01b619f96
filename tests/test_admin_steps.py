"""A large ``remove`` is applied in steps, as ``status`` reads in pages
(docs/api.md#allocator.FairAllocator.remove): no script run handles more
resources than a status page holds, so that none blocks the server for
long however many are removed at once. Each step is atomic; the count
and the pool's state are those of one big call. Fails where one run takes
more than a page of resources (500 a run, before: 10 ms of server time on Redis 7.0)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from allocator import FairAllocator
from allocator._core.admin import PAGE
from allocator._core.steps import Call


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


@pytest.fixture
def removes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The resources each remove script run was given."""
    seen: list[int] = []
    step = FairAllocator._step

    def counted(self: FairAllocator, what: Any) -> Any:
        if isinstance(what, Call) and what.script == "remove":
            seen.append(len(what.args) - 1)  # after the force flag
        return step(self, what)

    monkeypatch.setattr(FairAllocator, "_step", counted)
    return seen


def test_a_large_remove_is_applied_in_steps(
    client: Any, pool_name: str, removes: list[int]
) -> None:
    pool = FairAllocator(client, pool_name)
    names = [f"r{i}" for i in range(20_000)]
    pool.extend(names)
    held = pool.acquire(timeout=5)
    # Checked before any I/O: a bad name anywhere, nothing sent.
    with pytest.raises(ValueError, match="resource"):
        pool.remove([*names, ""])
    assert removes == []

    removed = pool.remove([*names, "unknown-1", "unknown-2"])
    assert removed == 20_000  # the leased one counts (draining), unknown names do not
    assert len(removes) > 1 and max(removes) <= PAGE, (len(removes), max(removes))
    assert sum(removes) == 20_002
    status = pool.status()
    assert (status.size, status.free, status.leased) == (1, 0, 1), status
    assert [r.state for r in status.resources] == ["draining"]
    assert pool.remove([held.resource], force=True) == 1
    assert pool.status().size == 0
    assert not pool.release(held)  # revoked
