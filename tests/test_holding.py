"""The holder's side of ``reclaim_on_disconnect`` (allocator/_core/holding.py):
when a process gives up a lease because its presence went unconfirmed, and
how often its watch looks. Pure: times are given."""

from __future__ import annotations

from allocator._core.holding import GIVE_UP, LINGER, PROBE, Holds
from allocator._core.liveness import GRACE, HEARTBEAT


def test_a_gap_shorter_than_the_grace_loses_nothing() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(0.1)
    holds.unanswered()
    assert not holds.lost("a", 0.1 + GRACE - 0.01)
    holds.confirmed(0.1 + GRACE - 0.01)  # the next PING was answered
    assert not holds.lost("a", 100.0)


def test_unconfirmed_past_the_grace_is_lost_for_good() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.hold("b", 0.0, 60.0, reclaim=False)
    holds.confirmed(1.0)
    holds.unanswered()
    assert holds.lost("a", 1.0 + GRACE + 0.01)
    assert not holds.lost("b", 1.0 + GRACE + 0.01)  # ends at its deadline only
    holds.confirmed(5.0)
    assert holds.lost("a", 5.0)  # a connection back does not bring it back


def test_a_new_subscription_after_a_long_gap_loses_what_was_held_through_it() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    holds.confirmed(1.0)
    holds.unanswered()
    holds.hold("late", 2.5, 60.0, reclaim=True)  # granted during the gap
    holds.confirmed(1.0 + GRACE + 0.5)  # subscribed again
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
    assert holds.period(1.0) == HEARTBEAT
    holds.hold("b", 0.0, 10.0, reclaim=True)
    assert holds.period(1.0) == PROBE
    holds.drop("b", 2.0)
    holds.renewed("a", 5.0, 10.0)
    assert holds.period(14.0) == HEARTBEAT  # renewed: held until 15
    assert holds.period(16.0) == HEARTBEAT  # past it: forgotten, lingering
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
    holds.confirmed(4.5 + GRACE - 0.1)
    assert not holds.lost("a", 10.0)


def test_after_a_ping_the_watch_subscribes_again_only_when_it_broke_or_is_hopeless() -> None:
    holds = Holds()
    holds.hold("a", 0.0, 60.0, reclaim=True)
    assert holds.probed(True, 1.0, 1.1) is False
    assert holds.probed(False, 1.25, 1.5) is False  # not yet answered: wait
    assert holds.probed(None, 1.5, 1.6) is True  # broke
    assert holds.probed(False, 3.0, 1.0 + GIVE_UP + 0.1) is True  # unanswered too long
    assert holds.lost("a", 1.0 + GIVE_UP + 0.1)
