"""The reader's round keeps every message it pops: a grant popped and
dropped reached its waiter late, or not at all.

A reader's round is one pipeline ``[BLPOP list block, LPOP list BATCH]``.
When the BLPOP times out and a grant is pushed before the LPOP runs, the
LPOP pops it: a reader that kept LPOP's reply only when BLPOP returned
something threw that grant away. The pick-up check put it back 2 s later;
with a ttl of 1 s the lease ran out unseen, its waiter queued again at the
back and a later requester was served first. ``CLIENT PAUSE`` (what
``FAILOVER`` uses) holds the LPOP while the BLPOP times out, which makes
the race happen every time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from _workers import Proc, async_leaser, interrupted_through_the_reader, leaser
from helpers import blocked_readers, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import FairAllocator, Lease
from allocator._core.keys import PICK
from allocator._core.liveness import HEARTBEAT
from allocator._core.pool import Pool
from allocator._core.reader import Reader, multipop_refused, popped, round_commands, round_replies


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


# -- the round's bookkeeping, as a model --------------------------------------------

keys = st.sampled_from(["k1", "k2", "k3"])
messages = st.text(alphabet="gh|0123456789abc", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    first=st.none() | st.tuples(keys, messages),
    rest=st.lists(st.tuples(keys, st.none() | st.lists(messages, max_size=4)), max_size=3),
)
def test_a_round_keeps_every_message_it_popped(
    first: tuple[str, str] | None, rest: list[tuple[str, list[str] | None]]
) -> None:
    """Whatever BLPOP answered, every message any command of the round
    popped comes out, once, in the order the server popped it."""
    out = popped(list(first) if first else None, rest)
    expected = ([first] if first else []) + [(k, m) for k, ms in rest for m in ms or ()]
    assert out == expected


@settings(max_examples=200, deadline=None)
@given(
    acks=st.lists(st.tuples(st.just("pick"), st.lists(messages, min_size=1, max_size=3))),
    listed=st.lists(keys, min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_the_replies_of_a_round_keep_every_popped_message(
    acks: list[tuple[str, list[str]]], listed: list[str], data: st.DataObject
) -> None:
    """The pipeline's replies as the server may give them (a timed-out
    BLPOP included) lose nothing: the round of a server without BLMPOP."""
    commands = round_commands(acks, listed, 1.0, multipop=False)
    first = data.draw(st.none() | st.tuples(st.sampled_from(listed), messages))
    lpops = [data.draw(st.none() | st.lists(messages, min_size=1, max_size=3)) for _ in listed]
    replies: list[Any] = [1 for _ in acks] + [list(first) if first else None, *lpops]
    out = round_replies(commands, replies)
    expected = ([first] if first else []) + [
        (key, m) for key, ms in zip(listed, lpops, strict=True) for m in ms or ()
    ]
    assert out == expected


@settings(max_examples=200, deadline=None)
@given(
    acks=st.lists(st.tuples(st.just("pick"), st.lists(messages, min_size=1, max_size=3))),
    listed=st.lists(keys, min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_a_multipop_round_keeps_every_popped_message(
    acks: list[tuple[str, list[str]]], listed: list[str], data: st.DataObject
) -> None:
    """The one-command round (BLMPOP, Redis >= 7): its reply, a list and
    the messages popped from it, or nil when it timed out, loses nothing."""
    commands = round_commands(acks, listed, 1.0)
    assert [c[0] for c in commands] == ["ZREM"] * len(acks) + ["BLMPOP"]
    got = data.draw(
        st.none() | st.tuples(st.sampled_from(listed), st.lists(messages, min_size=1, max_size=4))
    )
    replies: list[Any] = [1 for _ in acks] + [[got[0], got[1]] if got else None]
    assert round_replies(commands, replies) == ([(got[0], m) for m in got[1]] if got else [])


def test_a_server_without_blmpop_gets_blpop_rounds() -> None:
    commands = round_commands([], ["k1"], 1.0)
    refusal = redis.exceptions.ResponseError("unknown command 'BLMPOP', with args beginning with:")
    assert multipop_refused(commands, [refusal])
    assert not multipop_refused(commands, [None])
    assert not multipop_refused(round_commands([], ["k1"], 1.0, multipop=False), [None, None])


@settings(max_examples=200, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["register", "unregister", "grant", "hint"]), st.integers(0, 5)),
        max_size=40,
    )
)
def test_the_hub_routes_every_grant_somewhere(plan: list[tuple[str, int]]) -> None:
    """A grant popped by a round is delivered to its waiter, released for
    a waiter that left, or acknowledged again as a copy of one delivered:
    never dropped."""
    pool = Pool.create("p", lease_ttl=60, bind_ttl=60, prefix="alloc")
    hub = Reader(HEARTBEAT)
    key = pool.signal_key(hub.cid)
    delivered: dict[str, int] = {}
    registered: set[str] = set()
    ever: set[str] = set()  # the server grants only to a waiter that queued
    now = 1000.0
    for op, n in plan:
        lid = f"lid{n}"
        if op == "register":
            hub.register(pool, lid, lid)
            registered.add(lid)
            ever.add(lid)
        elif op == "unregister":
            hub.unregister(lid)
            registered.discard(lid)
        elif lid in ever:
            text = f"g|{lid}|1-{n}|7|1|60000|r" if op == "grant" else f"h|{lid}|250"
            acks_before = sum(len(s.acks) for s in hub._served.values())
            inbox, item, release = hub.route(key, text, now)
            acks_after = sum(len(s.acks) for s in hub._served.values())
            if op != "grant":
                continue
            if inbox is not None:
                assert inbox == lid and lid in registered and item == text
                delivered[lid] = delivered.get(lid, 0) + 1
            elif release is not None:
                assert lid not in registered and release.script == "release"
            else:  # a copy of a grant delivered before: acknowledged again
                assert lid in delivered and acks_after == acks_before + 1


def test_a_release_or_a_renew_is_the_grants_acknowledgement() -> None:
    """The server claims a grant at its lease's release or renewal
    (lua/prelude_leases.lua, P:claim): the reader then sends no acknowledgement of
    it, and a round that follows is the blocking pop alone."""
    pool = Pool.create("p", lease_ttl=60, bind_ttl=60, prefix="alloc")
    hub = Reader(HEARTBEAT)
    key = pool.signal_key(hub.cid)
    for lid in ("a", "b", "c"):
        hub.register(pool, lid, lid)
        assert hub.route(key, f"g|{lid}|1-0|7|1|60000|r", 1000.0)[0] == lid
        hub.unregister(lid)
    pick = pool.keys[PICK]
    assert hub.plan() == ([(pick, ["a", "b", "c"])], [])
    hub.claimed("b")  # released
    hub.claimed("x")  # a lease this hub never delivered: nothing to drop
    assert hub.plan() == ([(pick, ["a", "c"])], [])
    hub.claimed("a")  # renewed
    hub.claimed("c")
    assert hub.plan() == ([], []) and hub.idle
    hub.register(pool, "d", "d")
    acks, keys = hub.plan()
    assert round_commands(acks, keys, 1.0)[0][0] == "BLMPOP"
    assert len(round_commands(acks, keys, 1.0)) == 1


# -- the CLIENT PAUSE case, on a real server ------------------------------------------


@pytest.mark.real_redis
@pytest.mark.parametrize("mode", ["ALL", "WRITE"])
@pytest.mark.parametrize("worker", [leaser, async_leaser], ids=["sync", "asyncio"])
def test_a_grant_pushed_during_a_client_pause_reaches_its_waiter(
    redis_url: str,
    client: Any,
    pool_name: str,
    procs: Callable[..., Proc],
    mode: str,
    worker: Any,
) -> None:
    """A waiter queued just before a pause (ttl 1 s) gets the grant the
    release made during the pause, the first after it, and keeps its place
    before a waiter queued after it; no grant ran out unseen."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    early = procs(worker, redis_url, pool_name, ttl=1.0, **_go(worker))
    early.expect("ready")
    early.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="the early waiter queued")
    late = procs(leaser, redis_url, pool_name, wait_go=True)
    late.expect("ready")
    late.send("go")
    wait_until(lambda: pool.status().waiting == 2, what="the late waiter queued")
    wait_until(lambda: blocked_readers(client) == 2, what="both readers in their blocking pop")

    # The pause outlasts the readers' blocking time, so their BLPOPs time
    # out under it and the LPOPs behind them wait; the release, sent now,
    # is held too, and runs first when the pause ends.
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("CLIENT", "PAUSE", str(round((HEARTBEAT + 0.5) * 1000)), mode)
    releaser = threading.Thread(target=pool.release, args=(held,))
    releaser.start()
    releaser.join()
    admin.close()

    first: Lease = early.expect("granted", timeout=10)
    assert first.token > held.token
    early.send("release")
    assert early.expect("released") is True
    second: Lease = late.expect("granted", timeout=10)
    assert second.token > first.token and second.granted_at > first.granted_at
    late.send("release")
    assert late.expect("released") is True
    stats = pool.stats()
    assert (stats.grants, stats.reclaimed) == (3, 0)  # no grant made twice


def _go(worker: Any) -> dict[str, Any]:
    return {"wait_go": True} if worker is leaser else {}


@pytest.mark.real_redis
def test_a_sigint_taken_by_another_thread_still_interrupts_the_waiter(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """The kernel hands a process-directed SIGINT to any of its threads. One
    taken by another thread only sets Python's flag: a waiter blocked for
    ever (on its inbox, or in its blocking read) never saw it, and stayed
    queued (test_many's SIGINT case hung so, now and then, under load). It
    leaves the queue at once."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = procs(interrupted_through_the_reader, redis_url, pool_name)
    waiter.expect("ready")
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    wait_until(lambda: blocked_readers(client) == 1, what="its reader blocked")
    waiter.send("aim")
    waiter.expect("interrupted", timeout=10)
    assert pool.status().waiting == 0
    assert pool.release(held)
