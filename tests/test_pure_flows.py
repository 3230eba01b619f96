"""Orders of events, staged on the core alone (tests/harness.py): no
Redis, no threads, no real time.

Each test plays the shell: it answers the steps of an acquire, a release,
the ends still to deliver or a reader's rounds with canned replies, in the
order it wants (a grant together with the timeout, a round that fails, an
exception raised into the leading waiter, a reply lost), on a fake clock,
and checks what the core asked for: nothing granted is lost, nothing
unconfirmed is forgotten, and the reader goes on (docs/concepts.md#guarantees,
docs/concepts.md#the-reader, docs/concepts.md#ends-still-to-deliver).
"""

from __future__ import annotations

import asyncio

import pytest
from harness import (
    ALIVE,
    DUE_SLACK,
    HEARTBEAT,
    LEAD,
    MIN_TRY,
    PICK,
    RECHECK,
    RIDE_OUT,
    SIDE_BUDGET,
    THREAD,
    Beat,
    Call,
    Clock,
    Defer,
    Deliver,
    Exchange,
    Lead,
    Pool,
    Reader,
    Reading,
    Run,
    Sleep,
    Wait,
    acquiring,
    alive,
    block_for,
    end_key,
    grant_message,
    granted,
    hint_message,
    lease_of,
    make_pool,
    queued,
    refusal,
    step_error,
    tag,
    take_item,
    transport,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from allocator import AcquireTimeout, CorruptPool, Lease, LeaseLost


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock().install(monkeypatch)


@pytest.fixture
def pool() -> Pool:
    return make_pool()


class Boom(Exception):
    """What a caller's own code raises into a waiting thread."""


# -- an acquire: a grant and the timeout ---------------------------------------------


@pytest.mark.parametrize("where", ["last-wait", "late-poll"])
def test_a_grant_that_comes_with_the_timeout_is_kept(clock: Clock, pool: Pool, where: str) -> None:
    """The grant arrives as the waiter's time runs out: in the reply to
    its last wait, or in the reply to a look that came back past the
    deadline. The waiter returns it (no cancel: it would pass the lease
    on to the next waiter while its holder uses it)."""
    run = acquiring(pool, clock, timeout=1.0)
    run.call("acquire")
    if where == "last-wait":
        run.reply(queued("1-1"))
        assert run.wait().timeout == 1.0
        clock.advance(1.0)
        run.reply(grant_message(run.lid, "1-1"))
    else:
        run.reply(queued("1-1", hint_ms=500))  # look again in 0.5 s
        assert run.wait().timeout == 0.5
        run.wait_out()
        run.call("poll")
        clock.advance(0.6)  # its reply comes past the deadline
        run.reply(granted("1-1"))
    assert run.done and isinstance(run.value, Lease) and run.value.resource == "r"
    assert "cancel" not in run.scripts()


def test_a_grant_after_the_timeout_is_handed_back(clock: Clock, pool: Pool) -> None:
    """The wait ran out first: the waiter leaves the queue with a cancel
    of its own request, which passes a grant that raced in on to the next
    waiter ("released"), in a short try of its own past the deadline; the
    caller gets AcquireTimeout for the whole time."""
    run = acquiring(pool, clock, timeout=1.0)
    run.call("acquire")
    run.reply(queued("1-1"))
    run.wait_out()
    cancel = run.call("cancel")
    assert cancel.args == (run.lid,)
    assert cancel.deadline == pytest.approx(clock() + SIDE_BUDGET)
    with pytest.raises(AcquireTimeout) as raised:
        run.reply(tag("released"))
    assert raised.value.waited == pytest.approx(1.0)
    assert len(run.ends) == 0  # delivered: nothing left to send


# -- an acquire: an exception raised at a given step ----------------------------------


@pytest.mark.parametrize("kind", [KeyboardInterrupt, asyncio.CancelledError, Boom])
@pytest.mark.parametrize(
    "at", ["enqueue", "enqueue-backoff", "wait", "poll", "poll-backoff", "second-wait"]
)
def test_an_exception_at_any_step_leaves_the_queue(
    clock: Clock, pool: Pool, at: str, kind: type[BaseException]
) -> None:
    """Whatever the step the caller is interrupted at (a KeyboardInterrupt,
    a task's cancellation, an exception of its own code), the acquire sends
    the cancel of its own request before the exception goes on, once. (A
    real server checks that nothing is left behind: test_races.py.)"""
    run = acquiring(pool, clock, timeout=None)
    first = run.call("acquire")
    if at == "enqueue-backoff":
        assert isinstance(run.throw(transport()), Sleep)
    elif at != "enqueue":
        run.reply(queued("1-1", hint_ms=250))
        run.wait()
        if at != "wait":
            run.wait_out()
            run.call("poll")
            if at == "poll-backoff":
                assert isinstance(run.throw(transport()), Sleep)
            elif at == "second-wait":
                run.reply(queued("1-1"))
                run.wait()
    cancel = run.interrupt(kind())
    assert isinstance(cancel, Call) and cancel.script == "cancel"
    assert cancel.args == (run.lid,) == (first.args[0],)
    with pytest.raises(kind):
        run.reply(tag("cancelled"))
    assert run.scripts().count("cancel") == 1


def test_a_lost_enqueue_reply_is_retried_with_the_same_lease_id(clock: Clock, pool: Pool) -> None:
    """The enqueue ran, but its reply was lost: the retry is the same call
    (the same lease id), so the script finds the first try's ticket and
    the waiter keeps its place (the server's half: test_races.py)."""
    run = acquiring(pool, clock, timeout=10.0)
    first = run.call("acquire")
    assert isinstance(run.throw(transport()), Sleep)
    again = run.call("acquire")
    assert again.args == first.args and again.keys == first.keys
    assert again.deadline is not None and again.deadline > clock()
    run.reply(queued("1-1"))
    assert isinstance(run.wait(), Wait)


@pytest.mark.parametrize(
    ("reply", "raised"),
    [
        (refusal("ERR something the library does not know"), "ResponseError"),
        (refusal("ALLOCATOR-CORRUPT alloc:{p}:recs: a damaged record"), "CorruptPool"),
    ],
)
def test_an_error_reply_to_a_look_is_raised_after_the_cancel(
    clock: Clock, pool: Pool, reply: BaseException, raised: str
) -> None:
    """An error reply is the server's answer, not a lost one: no retry. The
    waiter leaves the queue, and the error goes out (a script's refusal
    as the library's own error, naming the pool)."""
    run = acquiring(pool, clock, timeout=10.0)
    run.call("acquire")
    run.reply(queued("1-1", hint_ms=100))
    run.wait_out()
    run.call("poll")
    run.throw(reply)
    run.call("cancel")
    with pytest.raises(Exception) as caught:
        run.reply(tag("cancelled"))
    assert type(caught.value).__name__ == raised
    if isinstance(caught.value, CorruptPool):
        assert caught.value.pool == "p"
    assert run.scripts() == ["acquire", "poll", "cancel"]


def test_a_timeout_while_the_reader_fails_says_why(clock: Clock, pool: Pool) -> None:
    """The waiter's time runs out while its client's reader fails: the
    wait's reply is the reader's trouble, and it is the cause of the
    AcquireTimeout."""
    run = acquiring(pool, clock, timeout=2.0)
    run.call("acquire")
    run.reply(queued("1-1"))
    down = transport("Connection reset by peer")
    run.wait_out(trouble=down)
    run.call("cancel")
    with pytest.raises(AcquireTimeout) as raised:
        run.reply(tag("cancelled"))
    assert raised.value.__cause__ is down


def test_stale_and_foreign_messages_are_never_taken_for_a_grant(clock: Clock, pool: Pool) -> None:
    """Junk, a grant naming another waiter, and a grant of this waiter's
    for another ticket leave it waiting; a hint moves its next look; its
    own grant ends the wait. (A real server checks that the foreign grant
    released nothing: test_races.py.)"""
    run = acquiring(pool, clock, timeout=None)
    run.call("acquire")
    run.reply(queued("1-5"))
    for stale in ("garbage", grant_message("someone-else", "1-5"), grant_message(run.lid, "1-1")):
        run.reply(stale)
        assert run.wait().timeout is None
    run.reply(hint_message(run.lid, 250))
    assert run.wait().timeout == pytest.approx(0.25)
    run.reply(grant_message(run.lid, "1-5", token=9))
    assert run.done and run.value.token == 9 and run.value.ticket == "1-5"
    assert run.scripts() == ["acquire"]


def test_a_lease_of_acquire_many_that_never_comes_is_looked_for_within_a_heartbeat(
    clock: Clock, pool: Pool
) -> None:
    """acquire_many(2): the first lease is pushed, the second never comes
    (it ended before it was popped): a look within a heartbeat settles it,
    and the reply of that look is what counts."""
    run = acquiring(pool, clock, timeout=None, count=2)
    run.call("acquire_many")
    run.reply(queued("1-1"))
    run.reply(grant_message(run.lid, "1-1"))
    assert run.wait().timeout == pytest.approx(HEARTBEAT)
    run.wait_out()
    poll = run.call("poll")
    assert poll.args[0] == run.lid and poll.args[-1] == 2
    row = granted("1-1")[1:]
    run.reply(["granted_many", *row, *granted("1-2", token=8, resource="s")[1:]])
    assert run.done and [lease.resource for lease in run.value] == ["r", "s"]


# -- the ends still to deliver --------------------------------------------------------


@pytest.mark.parametrize("error", ["transport", "refusal"])
def test_a_cancel_whose_reply_is_lost_is_kept_for_resending(
    clock: Clock, pool: Pool, error: str
) -> None:
    """An interrupted waiter's cancel meets a transport error: it may not
    have reached the server, where a grant may yet be made to the ticket.
    It is kept, for the lease's ttl, and sent again once the server
    answers; the caller gets its own exception. A refused cancel (an error
    reply: the server answered) is not kept."""
    run = acquiring(pool, clock, timeout=None)
    run.call("acquire")
    run.reply(queued("1-1"))
    run.wait()
    run.interrupt(KeyboardInterrupt())
    cancel = run.call("cancel")
    failure = transport() if error == "transport" else refusal("NOPERM no cancel for you")
    with pytest.raises(KeyboardInterrupt):
        run.throw(failure)
        run.settle()
    if error == "refusal":
        assert len(run.ends) == 0 and not any(isinstance(s, Defer) for s in run.steps)
        return
    (defer,) = [step for step in run.steps if isinstance(step, Defer)]
    assert defer.end.key == end_key(pool.keys, run.lid)
    assert defer.end.until == pytest.approx(clock() + pool.lease_ttl)
    assert len(run.ends) == 1
    # The client's sender: refused while the server is away, then delivered.
    sender = Run(run.ends.sending(clock), clock)
    again = sender.call("cancel")
    assert again.args == cancel.args
    assert isinstance(sender.throw(transport()), Sleep)
    sender.call("cancel")
    sender.reply(tag("released"))  # a grant had raced in: passed on
    assert sender.done and len(run.ends) == 0


def test_a_release_whose_replies_are_lost_is_kept_and_fences_a_renew(
    clock: Clock, pool: Pool
) -> None:
    """A release that gets no reply for its whole budget (a stall of the
    server) is handed to the sender before the error goes out; meanwhile a
    renew of the lease raises LeaseLost without asking the server (the
    release may reach it after the renewal); once delivered, a renew asks
    again."""
    lease = lease_of(pool)
    release = Run(pool.release(lease, None), clock)
    started = clock()
    tries = 0
    with pytest.raises(RedisConnectionError):
        while True:
            call = release.call("release")
            assert call.deadline is not None
            assert call.deadline <= started + RIDE_OUT + MIN_TRY
            tries += 1
            release.throw(transport())
    assert tries > 1 and clock() - started >= RIDE_OUT  # ridden out, on the fake clock
    assert len(release.ends) == 1
    renew = Run(pool.renew(lease, None), clock, release.ends)
    with pytest.raises(LeaseLost, match="still being delivered"):
        renew.settle()
    assert renew.scripts() == []
    sender = Run(release.ends.sending(clock), clock)
    assert sender.call("release").args == (lease.id, lease.ticket, "", "")
    sender.reply(tag("released"))
    assert sender.done and len(release.ends) == 0
    renew = Run(pool.renew(lease, None), clock, release.ends)
    assert renew.call("renew").args[0] == lease.id


# -- the reader: rounds, failures, the lead --------------------------------------------


def waiting(reading: Reading, pool: Pool, clock: Clock, ticket: str, timeout: float | None) -> Run:
    """An acquire of the reading's client, queued and waiting (registered
    with the reader first, as the shells do)."""
    run = acquiring(pool, clock, timeout, cid=reading.cid(pool))
    reading.join(pool, run.lid)
    run.call("acquire")
    run.reply(queued(ticket))
    run.wait()
    return run


def test_a_failed_round_then_an_exception_raised_into_the_leader(clock: Clock, pool: Pool) -> None:
    """The leader's round fails (the server dropped the connection): the
    rounds pause. Then an exception is raised into the leader (a
    KeyboardInterrupt): it goes out of that waiter's acquire, which leaves
    the queue, and not into the rounds; the lead passes to the other
    waiter, which carries out the same pause, beats first, and reads its
    own grant."""
    reading = Reading(clock)
    a = waiting(reading, pool, clock, "1-1", None)
    b = waiting(reading, pool, clock, "1-2", None)
    assert reading.take(a.lid) and not reading.take(b.lid)
    assert isinstance(reading.next(a.lid), Exchange)
    down = transport()
    assert reading.fail(a.lid, down) is False  # the step's own error: to the rounds
    pause = reading.next(a.lid)
    assert isinstance(pause, Sleep) and reading.core.trouble is down

    assert reading.raised(a.lid, KeyboardInterrupt()) is True  # out of a's call
    assert reading.lead.reading and reading.lead.leader == b.lid
    assert reading.core.trouble is down
    a.interrupt(KeyboardInterrupt())
    assert a.call("cancel").args == (a.lid,)
    with pytest.raises(KeyboardInterrupt):
        a.reply(tag("cancelled"))
    reading.gone(a.lid)

    assert reading.item(b.lid) is LEAD and reading.take(b.lid)
    assert reading.next(b.lid) is pause  # the step left by a: b carries it out
    reading.carry(b.lid)
    assert isinstance(reading.next(b.lid), Beat)  # the first thing once it answers
    reading.carry(b.lid)
    exchange = reading.next(b.lid)
    assert isinstance(exchange, Exchange) and exchange.keys == [reading.key(pool)]
    reading.answer([(reading.key(pool), grant_message(b.lid, "1-2"))])
    assert isinstance(reading.carry(b.lid), Deliver)
    assert reading.core.trouble is None  # the round went through
    assert reading.next(b.lid) is None  # its own message came: it stops leading
    b.reply(reading.item(b.lid))
    assert b.done and b.value.ticket == "1-2"


def test_a_reader_round_that_fails_then_succeeds_sends_its_acknowledgements_again(
    clock: Clock, pool: Pool
) -> None:
    """A grant delivered in one round is acknowledged in the next. That
    round fails: the acknowledgement is kept, the reader pauses, beats
    first once the server answers, and sends it with the next round; once
    through, it is not sent again."""
    reading = Reading(clock)
    a = waiting(reading, pool, clock, "1-1", None)
    b = waiting(reading, pool, clock, "1-2", None)
    assert reading.take(a.lid) and not reading.take(b.lid)
    reading.carry(a.lid, popped=[(reading.key(pool), grant_message(a.lid, "1-1"))])
    assert isinstance(reading.carry(a.lid), Deliver)
    a.reply(reading.item(a.lid))
    assert a.done
    assert reading.leave(a.lid) is reading.inboxes[b.lid]  # the lead passes on
    reading.gone(a.lid)
    assert reading.item(b.lid) is LEAD and reading.take(b.lid)

    ack = [(pool.keys[PICK], [a.lid])]
    first = reading.next(b.lid)
    assert isinstance(first, Exchange) and first.acks == ack
    reading.fail(b.lid, transport())
    assert isinstance(reading.carry(b.lid), Sleep)
    assert isinstance(reading.carry(b.lid), Beat)
    again = reading.next(b.lid)
    assert isinstance(again, Exchange) and again.acks == ack
    reading.carry(b.lid)
    assert reading.until(b.lid, Exchange).acks == []
    assert reading.core.trouble is None


def test_a_heartbeat_comes_due_while_a_round_is_blocked(clock: Clock, pool: Pool) -> None:
    """A round blocks no longer than the next heartbeat is due; a round
    whose reply comes late is followed by the heartbeat, not by another
    round. A heartbeat that finds the head's client absent brings the next
    one forward, to when that client counts as gone."""
    reading = Reading(clock, beat=HEARTBEAT)
    a = waiting(reading, pool, clock, "1-1", None)
    assert reading.take(a.lid)
    first = reading.next(a.lid)
    assert isinstance(first, Exchange) and first.block == pytest.approx(HEARTBEAT)
    clock.advance(0.4)  # it returned early, with nothing for anyone
    reading.answer([])
    second = reading.next(a.lid)
    assert isinstance(second, Exchange) and second.block == pytest.approx(HEARTBEAT - 0.4)
    clock.advance(second.block + 0.3)  # its reply came late
    reading.answer([])
    assert isinstance(reading.next(a.lid), Beat)
    reading.carry(a.lid, beats=[alive(due_ms=300)])  # the head counts as gone in 0.3 s
    third = reading.next(a.lid)
    assert isinstance(third, Exchange) and third.block == pytest.approx(0.3 + DUE_SLACK)
    reading.carry(a.lid)
    assert isinstance(reading.next(a.lid), Beat)


def test_a_grant_popped_after_a_silence_past_the_liveness_window_is_not_trusted(
    clock: Clock, pool: Pool
) -> None:
    """The leader's process stalled while its round was blocked, past the
    client's liveness window: the grant the round popped may have been
    taken back meanwhile. Its waiter is told to look (it is not handed
    the grant, which is not acknowledged), the heartbeat that follows
    tells every waiter to look, and a look hands over the grant if it is
    still the waiter's."""
    reading = Reading(clock)
    a = waiting(reading, pool, clock, "1-1", None)
    b = waiting(reading, pool, clock, "1-2", None)
    assert reading.take(a.lid)
    assert isinstance(reading.next(a.lid), Exchange)
    clock.advance(ALIVE + 1.0)
    reading.answer([(reading.key(pool), grant_message(a.lid, "1-1"))])
    deliver = reading.next(a.lid)
    assert isinstance(deliver, Deliver)
    assert [item for _, item in deliver.items] == [RECHECK] and deliver.releases == []
    reading.carry(a.lid)
    assert reading.core.plan()[0] == []  # nothing to acknowledge
    assert reading.item(a.lid) == RECHECK
    reading.leave(a.lid)
    assert reading.item(b.lid) is LEAD and reading.take(b.lid)
    assert isinstance(reading.carry(b.lid), Beat)
    told = reading.carry(b.lid)
    assert isinstance(told, Deliver)
    assert reading.item(a.lid) == RECHECK and reading.item(b.lid) == RECHECK
    a.reply(RECHECK)
    a.call("poll")
    a.reply(granted("1-1"))
    assert a.done and a.value.ticket == "1-1"


@pytest.mark.parametrize("lease", ["single", "many-second"])
def test_the_hub_hands_back_a_grant_whose_waiter_left(clock: Clock, pool: Pool, lease: str) -> None:
    """A grant popped after its waiter left (its acquire timed out) goes
    back: a release that passes it on only if nobody claimed it (the
    waiter may have been handed it by a look). A copy of a grant that was
    delivered (put back on the list after a lost reply) is acknowledged
    again and never released."""
    reading = Reading(clock)
    gone = waiting(reading, pool, clock, "1-1", 1.0)
    stays = waiting(reading, pool, clock, "1-2", None)
    reading.gone(gone.lid)
    assert reading.take(stays.lid)
    lid = gone.lid if lease == "single" else f"{gone.lid}.2"
    reading.carry(stays.lid, popped=[(reading.key(pool), grant_message(lid, "1-1"))])
    deliver = reading.next(stays.lid)
    assert isinstance(deliver, Deliver) and deliver.items == []
    (release,) = deliver.releases
    assert release.script == "release" and release.args == (lid, "1-1", "", "1")
    reading.carry(stays.lid)
    assert reading.releases == [release]

    # stays gets its grant, leaves; its copy comes back on the list.
    reading.carry(stays.lid, popped=[(reading.key(pool), grant_message(stays.lid, "1-2"))])
    reading.carry(stays.lid)
    stays.reply(reading.item(stays.lid))
    assert stays.done
    reading.leave(stays.lid)
    assert reading.gone(stays.lid) is THREAD  # acknowledgements left: the reader's thread
    assert reading.lead.thread_takes()
    copy = reading.next(THREAD)
    assert isinstance(copy, Exchange) and copy.acks == [(pool.keys[PICK], [stays.lid])]
    assert copy.keys == []  # nobody waits: nothing to block on
    reading.answer([(reading.key(pool), grant_message(stays.lid, "1-2"))])
    again = reading.next(THREAD)
    assert isinstance(again, Exchange) and again.acks == [(pool.keys[PICK], [stays.lid])]
    assert reading.releases == [release]


# -- moved here: the lead, and exceptions in the rounds (no server needed) ------------


def test_a_grant_pushed_before_the_waiter_blocks_is_its_first_read(
    clock: Clock, pool: Pool
) -> None:
    """The release ran between the enqueue and the waiter's first read:
    the round finds the grant at once, and the waiter needs no look of its
    own (enqueue, one wait). What it leaves to acknowledge goes with the
    reader's thread. (From test_races.py, where a server only put the
    release between the two.)"""
    reading = Reading(clock)
    waiter = waiting(reading, pool, clock, "1-1", None)
    assert reading.take(waiter.lid)
    exchange = reading.next(waiter.lid)
    assert isinstance(exchange, Exchange) and exchange.keys == [reading.key(pool)]
    reading.answer([(reading.key(pool), grant_message(waiter.lid, "1-1"))])
    assert isinstance(reading.carry(waiter.lid), Deliver)
    assert reading.next(waiter.lid) is None
    waiter.reply(reading.item(waiter.lid))
    assert waiter.done and waiter.value.resource == "r"
    assert len(waiter.steps) == 2 and waiter.scripts() == ["acquire"]
    assert reading.leave(waiter.lid) is None
    assert reading.gone(waiter.lid) is THREAD and reading.lead.thread_takes()
    ack = reading.next(THREAD)
    assert isinstance(ack, Exchange) and ack.acks == [(pool.keys[PICK], [waiter.lid])]
    reading.answer([])
    assert reading.next(THREAD) is None and not reading.lead.reading  # idle: the rounds end


def test_the_lead_decides_who_reads(clock: Clock, pool: Pool) -> None:
    reading = Reading(clock)
    inboxes = {lid: reading.join(pool, lid) for lid in ("a", "b", "c")}
    lead = reading.lead

    assert reading.take("a") is True and lead.reading
    assert reading.take("b") is False
    assert reading.take("c") is False
    assert lead.kick() is None  # "a" leads
    # The leader leaves: the follower that waited longest leads.
    assert lead.leave("a") is inboxes["b"] and lead.leader == "b"
    inboxes["b"].put(LEAD)
    assert take_item(inboxes["b"]) is LEAD  # (a stale lead is no item)
    assert reading.take("b") is True
    # A follower that leaves does not touch the lead.
    assert lead.leave("c") is None and lead.leader == "b"
    assert lead.leave("b") is None  # nobody follows; "a", "b", "c" still registered
    for lid in inboxes:
        reading.core.unregister(lid)
    assert lead.kick() is THREAD  # nobody waits, the rounds are not over
    assert lead.thread_takes() is True and lead.leader is THREAD
    assert lead.leave(THREAD) is THREAD  # rounds still not ended: the thread again
    reading.join(pool, "d")
    assert lead.thread_takes() is False  # never while anyone waits


def test_a_pause_outlasting_its_leader_is_finished_by_the_next() -> None:
    lead = Lead(Reader(HEARTBEAT))
    assert lead.pause(2.0, 100.5, 100.0) == (0.5, False)  # its time ends first
    assert lead.pause(2.0, None, 100.5) == (1.5, True)  # the next sleeps the rest
    assert lead.pause(1.0, 200.0, 100.0) == (1.0, True)
    assert block_for(Exchange([], ["k"], 1.0), 100.2, 100.0) == pytest.approx(0.2)
    assert block_for(Exchange([], ["k"], 1.0), 100.0, 100.0) == 0.01
    assert block_for(Exchange([], [], 1.0), 100.0, 100.0) == 1.0
    assert block_for(Exchange([], ["k"], 1.0), None, 100.0) == 1.0


def drive_rounds(clock: Clock, throw_at: set[int], steps: int = 40) -> list[str]:
    """Run the rounds of one waiter's lead for ``steps`` steps, the step
    numbered in ``throw_at`` failing with an error reply; the kinds of the
    steps."""
    reading = Reading(clock)
    reading.join(make_pool(), "a")
    assert reading.take("a")
    kinds = []
    for number in range(steps):
        while reading.item("a") is not LEAD:  # the waiter looks, and waits again
            pass
        step = reading.next("a")
        assert step is not None and reading.lead.reading, f"the rounds ended at step {number}"
        kinds.append(type(step).__name__)
        if number in throw_at:
            assert reading.fail("a", refusal(f"ERR boom {number}")) is False
        else:
            reading.carry("a")
    return kinds


def test_an_error_at_any_step_of_the_rounds_never_ends_them(clock: Clock) -> None:
    # A failed round leads into the error branch (Deliver, then Sleep):
    # an error there too, at once or one step later, must be taken as the
    # first was.
    kinds = drive_rounds(clock, set())
    assert {"Beat", "Exchange"} <= set(kinds)
    for first in range(12):
        for second in (None, first + 1, first + 2, first + 3):
            throw_at = {first} if second is None else {first, second}
            kinds = drive_rounds(clock, throw_at)
            assert "Sleep" in kinds


def test_rounds_ended_by_an_exception_start_afresh_with_the_next_leader(
    clock: Clock, pool: Pool
) -> None:
    # An exception raised into the leader while the rounds' own code ran
    # (between two steps) ends them: it comes out of that leader once, the
    # lead passes to a follower, and fresh rounds start with it; the old
    # exception is never raised again.
    reading = Reading(clock)
    inboxes = {lid: reading.join(pool, lid) for lid in ("a", "b")}
    assert reading.take("a") and not reading.take("b")
    assert isinstance(reading.next("a"), Exchange)

    def succeeded() -> None:
        raise KeyboardInterrupt  # raised into the thread in the rounds' code

    reading.core.succeeded = succeeded  # type: ignore[method-assign]
    reading.answer([])
    with pytest.raises(KeyboardInterrupt):
        reading.next("a")
    del reading.core.succeeded
    assert reading.leave("a") is inboxes["b"]  # the lead passes on
    assert reading.item("b") is LEAD and reading.take("b")
    assert reading.carry("b") is not None and reading.lead.reading
    assert reading.next("b") is not None


def test_only_a_step_error_goes_to_the_rounds() -> None:
    assert step_error("a", transport("gone"))
    assert step_error("a", refusal())
    assert not step_error("a", Boom())
    assert not step_error("a", TimeoutError())  # an alarm handler's
    assert not step_error("a", KeyboardInterrupt())
    assert step_error(THREAD, Boom())  # nobody to raise it to
    assert not step_error(THREAD, KeyboardInterrupt())
