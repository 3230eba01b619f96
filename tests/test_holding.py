"""The holder's side of ``reclaim_on_disconnect`` (allocator/_core/presence.py):
when a process gives up a lease because its presence went unconfirmed, and
how often its watch looks, and the watch's flow. Pure: times are given."""

from __future__ import annotations

from typing import Any

import pytest

from allocator._core.pending import Reclaimable
from allocator._core.pool import Pool
from allocator._core.presence import (
    GIVE_UP,
    GRACE,
    LINGER,
    LISTEN,
    PROBE,
    RESUBSCRIBE_FIRST,
    SAFE,
    GiveUp,
    Holds,
    Listen,
    Pause,
    Presences,
    Probe,
    Resubscribe,
    watch,
)
from allocator._values import Lease


def test_the_safe_part_of_the_grace_leaves_room_before_the_server_may_end_a_lease() -> None:
    """The server ends a lease a whole grace after an absence it found,
    which can only start after the client's last confirmation; the client
    gives up after SAFE from that confirmation: a quarter of the grace
    earlier at least."""
    assert SAFE <= 0.75 * GRACE


def test_a_gap_shorter_than_the_grace_loses_nothing() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.1)
    holds.unanswered()
    assert not holds.lost("a", 0.1 + SAFE - 0.01)
    holds.confirmed(0.1 + SAFE - 0.01)  # the next PING was answered
    assert not holds.lost("a", 100.0)


def test_unconfirmed_past_the_grace_is_lost_for_good() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.hold("b", 0.0, 60.0, reclaim=False)
    holds.confirmed(1.0)
    holds.unanswered()
    assert holds.lost("a", 1.0 + SAFE + 0.01)
    assert not holds.lost("b", 1.0 + SAFE + 0.01)  # ends at its deadline only
    holds.confirmed(5.0)
    assert holds.lost("a", 5.0)  # a connection back does not bring it back


def test_a_new_subscription_after_a_long_gap_loses_what_was_held_through_it() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(1.0)
    holds.unanswered()
    holds.hold("late", 2.5, 60.0, reclaim=True)  # granted during the gap
    holds.confirmed(1.0 + SAFE + 0.5)  # subscribed again
    assert holds.lost("a", 3.0)
    assert not holds.lost("late", 3.0)  # its own gap was shorter


def test_a_stall_without_a_break_loses_nothing() -> None:
    """SIGSTOP: nothing was found unanswered; the first PING after it is."""
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.25)
    assert not holds.lost("a", 30.0)
    holds.confirmed(0.25)  # the answer to a PING sent before the stop
    assert not holds.lost("a", 30.0)


def test_the_watch_probes_often_for_a_reclaimable_lease_and_ends_when_idle() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 10.0, reclaim=False)
    assert holds.period(1.0) == LISTEN
    holds.hold("b", 0.0, 10.0, reclaim=True)
    assert holds.period(1.0) == PROBE
    holds.drop("b", 2.0)
    holds.renewed("a", 5.0, 10.0)
    assert holds.period(14.0) == LISTEN  # renewed: held until 15
    assert holds.period(16.0) == LISTEN  # past it: forgotten, lingering
    assert not holds.holding
    assert holds.period(16.0 + LINGER + 0.1) is None


def test_a_connection_unconfirmed_for_long_is_given_up() -> None:
    holds = Holds()
    holds.confirmed(1.0)
    assert not holds.hopeless(100.0)
    holds.unanswered()
    assert not holds.hopeless(1.0 + GIVE_UP - 0.1)
    assert holds.hopeless(1.0 + GIVE_UP + 0.1)


def test_a_refused_connection_moves_the_gap_on() -> None:
    """The server was not running when it refused: a restart however long
    loses nothing if the presence is back within the grace of its return."""
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(1.0)
    holds.unanswered()
    for at in (1.5, 2.5, 3.5, 4.5):  # the watch's tries while it is down
        holds.refused(at)
        assert not holds.lost("a", at + 0.2)
    holds.confirmed(4.5 + SAFE - 0.1)
    assert not holds.lost("a", 10.0)


def test_after_a_ping_the_watch_subscribes_again_only_when_it_broke_or_is_hopeless() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    assert holds.probed(True, 1.0, 1.1) is False
    assert holds.probed(False, 1.25, 1.5) is False  # not yet answered: wait
    assert holds.probed(None, 1.5, 1.6) is True  # broke
    assert holds.probed(False, 3.0, 1.0 + GIVE_UP + 0.1) is True  # unanswered too long
    assert holds.lost("a", 1.0 + GIVE_UP + 0.1)


def test_a_new_subscription_confirms_nothing_until_the_server_confirms_the_return() -> None:
    """A connection that drops and comes back again and again: each PING
    answered on a new connection before the server confirmed the return
    (lua/present.lua) proves nothing, since an absence the scripts found
    before it may still be counting. Only the return confirms."""
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.2)
    holds.resubscribing()  # dropped at about 0.3
    assert holds.suspended and holds.fresh
    assert holds.probed(True, 0.4, 0.41) is False  # answered, but fresh
    assert holds.probed(True, 0.6, 0.61) is False
    assert holds.suspended
    assert holds.lost("a", 0.2 + SAFE + 0.01)  # never confirmed: given up


def test_each_confirmed_return_ends_the_suspension() -> None:
    """Flapping: dropped and back every 50 ms, each return confirmed: the
    lease is never given up, however long it goes on."""
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.0)
    at = 0.0
    while at < 10.0:
        holds.resubscribing()
        assert not holds.lost("a", at + 0.01)
        holds.returned(at + 0.005)
        assert not holds.suspended and not holds.fresh
        at += 0.05
    assert not holds.lost("a", at)
    assert holds.probed(True, at + 0.1, at + 0.11) is False


def test_the_watch_listens_while_waiting_and_sends_nothing_without_a_reclaimable_lease() -> None:
    holds = Holds()
    assert holds.period(0.0, waiting=True) == LISTEN
    holds.hold("a", 0.0, 10.0, reclaim=False)
    assert not holds.probing
    holds.hold("b", 0.0, 10.0, reclaim=True)
    assert holds.probing


def test_an_end_the_server_told_is_lost_at_once() -> None:
    """``e|<lease id>`` on the presence channel (a revoke, a reclaim): lost
    from then on, whatever the presence; other messages and leases not held
    here change nothing."""
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=False)
    holds.hold("b", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.0)
    holds.heard(["x|a", "e|zzz", "e|"])
    assert not holds.lost("a", 1.0) and not holds.lost("b", 1.0)
    holds.heard(["e|a"])
    assert holds.lost("a", 1.0) and not holds.lost("b", 1.0)
    holds.drop("a", 2.0)
    assert not holds.lost("a", 2.0)
    holds.ended("b")
    assert holds.lost("b", 2.0)


def test_messages_are_read_in_every_form() -> None:
    from allocator._presence import _message

    for reply in (
        [b"smessage", b"ch", b"e|x"],
        ["smessage", "ch", "e|x"],
        (b"message", b"ch", b"e|x"),
        ["message", "ch", "e|x"],
    ):
        assert _message(reply) == "e|x"
    for reply in ([b"pong", b"allocator-probe-1"], b"PONG", [b"ssubscribe", b"ch", 1], None):
        assert _message(reply) is None


# -- the watch's flow (allocator/_core/presence.py, watch) -----------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watching(reclaim: bool = False) -> tuple[Any, Holds, Reclaimable, _Clock, list[bool]]:
    """A watch over one lease held in a pool where the client keeps a
    presence; the list: set its item to stop the watch."""
    pool = Pool.create("p", lease_ttl=60, bind_ttl=3600, prefix="alloc")
    presences = Presences("c1")
    presences.decide(pool, True)
    holds, reclaimable, clock, stop = Holds(), Reclaimable(), _Clock(), [False]
    lease = Lease(resource="r", token=1, id="lid", ticket="1-1", expires_at=60.0, ttl=60.0,
                  granted_at=0.0, pool="p")  # fmt: skip
    holds.hold(lease.id, 0.0, lease.ttl, reclaim)
    if reclaim:
        reclaimable.hold(pool.name, pool.keys, lease, 0.0)
    flow = watch(holds, presences, reclaimable, lambda: False, clock, lambda: stop[0])
    return flow, holds, reclaimable, clock, stop


def test_the_watch_subscribes_again_when_its_connection_drops_and_backs_off_on_failure() -> None:
    flow, _, _, clock, stop = _watching()
    assert next(flow) == Listen(LISTEN)
    assert flow.send([]) == Listen(LISTEN)  # connected, nothing said: listen on
    step = flow.send(None)  # the connection dropped
    assert isinstance(step, Resubscribe) and len(step.channels) == 1
    clock.now = 0.5
    step = flow.send(False)  # failed: a short pause, then again
    assert isinstance(step, Pause) and 0 < step.seconds <= RESUBSCRIBE_FIRST
    assert flow.send(None) == Listen(LISTEN)
    assert isinstance(flow.send(None), Resubscribe)
    assert flow.send(None) == Listen(LISTEN)  # subscribed again
    stop[0] = True
    with pytest.raises(StopIteration):
        flow.send([])


def test_the_watch_probes_for_a_reclaimable_lease_and_gives_it_up_when_unconfirmed() -> None:
    flow, holds, _, clock, _ = _watching(reclaim=True)
    assert next(flow) == Listen(PROBE)
    clock.now = 0.3
    assert flow.send([]) == Probe()
    assert flow.send(True) == Listen(PROBE)  # answered: confirmed, nothing else
    clock.now = 0.6
    assert flow.send([]) == Probe()
    assert flow.send(False) == Listen(PROBE)  # not answered yet: no new connection
    clock.now = 0.6 + SAFE + 0.1  # unconfirmed past the safe part of the grace
    assert holds.lost("lid", clock.now)
    assert flow.send([]) == Probe()
    step = flow.send(False)  # handed over at the top of the next turn
    assert isinstance(step, GiveUp)
    assert [release.end.call.args[0] for release in step.releases] == ["lid"]
    assert flow.send(None) == Listen(PROBE)


def test_a_refused_subscription_moves_the_gap_on() -> None:
    flow, holds, _, clock, _ = _watching(reclaim=True)
    next(flow)
    clock.now = 0.3
    assert flow.send([]) == Probe()
    holds.confirmed(0.3)
    clock.now = 1.0
    assert isinstance(flow.send(None), Resubscribe)  # the PING found it broken
    assert isinstance(flow.send(True), Pause)  # refused: the server was down at 1.0
    assert not holds.lost("lid", 0.3 + SAFE + 0.2)  # so the gap starts there
