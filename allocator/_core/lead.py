"""Who carries out a reader's rounds: the waiter reads its own grant.

While waiters of one client wait, there is no reader of its own: the first
waiter *leads*, carrying out the reader's rounds (:meth:`Reader.rounds`) itself,
and the others *follow*, each woken by the message the leader routes to
its inbox. When the leader's own message comes, or its time runs out, it
hands the lead to the follower that has waited longest. When nobody waits,
what is left to acknowledge waits :data:`~allocator._core.reader.ACK_DELAY`
for the next waiter's round; then the reader's own thread (asyncio: task)
sends it. That thread never leads while anyone waits. The sync reader's
thread, once started, stays for :data:`THREAD_LINGER` after it was last
asked: asking it is a notification, so that a waiter never waits for a
thread to start on its way out of ``acquire()``.

:class:`Lead` decides all of it, for both shells. Pure: the sync shell holds
its lock around every call; the shells carry out the steps, wake whom it
names and start the thread (or task) when it says so.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from redis.exceptions import RedisError

from ..errors import AllocatorError
from .reader import READ_SLACK, Reader
from .steps import Exchange, ReaderStep

#: An inbox item: the lead is yours (if it still is: :meth:`Lead.take`).
LEAD: Any = object()
#: Who leads when the reader's own thread (or task) does; also what
#: :meth:`Lead.leave` returns when that thread must be started.
THREAD: Any = object()
#: How long the sync reader's thread, with nothing asked of it, waits to be
#: asked again before it ends (a worker that loops asks it every grant).
THREAD_LINGER = 5.0
#: What a shell's step gives back when a leader could not finish it before
#: its deadline (a pause, :meth:`Lead.pause`): not done, the next leader
#: finishes it.
PARTIAL: Any = object()


def take_item(inbox: Any) -> Any:
    """The next item of ``inbox`` that is not a stale :data:`LEAD`, else
    :data:`LEAD` (nothing there). A queue.SimpleQueue or an asyncio.Queue."""
    while not inbox.empty():
        item = inbox.get_nowait()
        if item is not LEAD:
            return item
    return LEAD


class Lead:
    """The lead of one reader: the reader's rounds while they run, the step
    taken from them and not yet carried out (whoever leads next carries it,
    should the leader be interrupted), the last step's result, who leads
    (a waiter's lease id, :data:`THREAD`, or None) and who follows (lease
    id to inbox, oldest first)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.rounds: Generator[ReaderStep, Any, None] | None = None
        self._step: ReaderStep | None = None
        self._result: tuple[Any, BaseException | None] = (None, None)
        self.leader: Any = None
        self.followers: dict[str, Any] = {}
        #: When a pause of the rounds ends (it may outlast a leader).
        self._pause_until: float | None = None

    @property
    def reading(self) -> bool:
        """Rounds are under way (somebody waits, or is left to acknowledge)."""
        return self.rounds is not None

    def take(self, lid: str, inbox: Any, clock: Callable[[], float]) -> bool:
        """Waiter ``lid`` has nothing in ``inbox`` and waits: True if it
        leads now (nobody did, or the lead was handed to it), else it
        follows. ``clock``: the rounds' monotonic clock."""
        if self.leader is None or self.leader == lid:
            self.leader = lid
            self.followers.pop(lid, None)
            if self.rounds is None:
                self.rounds = self.reader.rounds(clock)
                self._result = (None, None)
            return True
        self.followers[lid] = inbox
        return False

    def leave(self, who: Any) -> Any:
        """Waiter ``who`` (or :data:`THREAD`) stops waiting or leading:
        what :meth:`kick` says to do next."""
        if who is not THREAD:
            self.followers.pop(who, None)
        if self.leader != who:
            return None
        self.leader = None
        return self.kick()

    def kick(self) -> Any:
        """Nobody leads: the inbox of the follower that has waited longest,
        which leads now (put :data:`LEAD` in it); :data:`THREAD` when nobody
        waits and the rounds still have work (start the thread, which waits
        ACK_DELAY first); None when there is nothing to do (a waiter between
        two steps of its flow comes back to wait, or leaves)."""
        if self.leader is not None or (self.rounds is None and not self.followers):
            return None
        if self.followers:
            lid, inbox = next(iter(self.followers.items()))
            self.leader = lid
            return inbox
        return None if self.reader.waiting else THREAD

    def thread_takes(self) -> bool:
        """The reader's thread, after its delay: whether it leads now
        (nobody leads, nobody waits, rounds are left)."""
        if self.leader is not None or self.reader.waiting or self.rounds is None:
            return False
        self.leader = THREAD
        return True

    def next_step(
        self, me: Any, inbox: Any, deadline: float | None, now: float
    ) -> ReaderStep | None:
        """The step that leader ``me`` carries out next, or None when it
        stops: its ``inbox`` holds something, its ``deadline`` passed, a
        waiter comes while the thread leads, or the rounds ended
        (:attr:`reading` is then False)."""
        if inbox is not None and not inbox.empty():
            return None
        if me is THREAD and self.reader.waiting:
            return None
        if deadline is not None and now >= deadline:
            return None
        if self._step is None:
            if self.rounds is None:
                return None
            reply, error = self._result
            try:
                self._step = self.rounds.send(reply) if error is None else self.rounds.throw(error)
            except StopIteration:
                self.rounds = None
                return None
            except BaseException:
                # Raised into the leader's thread while the rounds' own code
                # ran: it ended them. It goes out with this leader, and the
                # next one starts the rounds afresh (nothing of it stays).
                self.rounds = None
                self._result = (None, None)
                raise
        return self._step

    def done(self, reply: Any, error: BaseException | None) -> None:
        """The step given by :meth:`next_step` was carried out: ``reply``,
        or ``error`` to throw into the rounds."""
        self._step = None
        self._result = (reply, error)

    @staticmethod
    def bounds(step: Exchange, deadline: float | None, now: float) -> tuple[float, float]:
        """A round ``step`` under a leader whose time ends at ``deadline``:
        how long it blocks (:func:`block_for`) and how long the leader waits
        for its reply (:func:`read_wait`)."""
        block = block_for(step, deadline, now)
        return block, read_wait(block, deadline, now)

    def pause(self, seconds: float, deadline: float | None, now: float) -> tuple[float, bool]:
        """A pause step (``Sleep``) under a leader whose time ends at
        ``deadline``: how long to sleep now, and whether the pause is over
        after that (else the next leader sleeps the rest)."""
        if self._pause_until is None:
            self._pause_until = now + seconds
        until = self._pause_until
        if deadline is not None and deadline < until:
            return max(0.0, deadline - now), False
        self._pause_until = None
        return max(0.0, until - now), True


def step_error(who: Any, error: BaseException) -> bool:
    """Whether ``error``, raised while leader ``who`` carried out a step of
    the rounds, is the step's own: a Redis error or one of the library's,
    thrown into the rounds (:meth:`Lead.done`), which decide. Anything else
    was raised into the leader's thread (a KeyboardInterrupt, a
    cancellation, a signal handler's exception, ``PyThreadState_SetAsyncExc``):
    it leaves the lead and goes out of that waiter's own call, the step is
    left to the next leader (docs/concepts.md#the-reader). The reader's own
    thread (:data:`THREAD`) has no caller to raise to: an ordinary exception
    goes to its rounds."""
    if not isinstance(error, Exception):
        return False
    return who is THREAD or isinstance(error, (RedisError, AllocatorError))


def block_for(step: Exchange, deadline: float | None, now: float) -> float:
    """How long a leader whose time ends at ``deadline`` blocks in the
    round ``step``: no longer than its time (at least 10 ms)."""
    if deadline is None or not step.keys:
        return step.block
    return max(0.01, min(step.block, deadline - now))


#: How late past a leader's deadline the reply to its round may come before
#: the leader takes the server for hung and gives up (Redis answers a BLPOP
#: whose time ran out up to 1/hz, 0.1 s, late): a waiter whose server hangs
#: while it leads returns about this long after its timeout, not
#: :data:`~allocator._core.reader.READ_SLACK` later.
LATE_REPLY = 0.2


def read_wait(block: float, deadline: float | None, now: float) -> float:
    """How long a leader whose time ends at ``deadline`` waits for the reply
    to a round that blocks ``block`` seconds: the block and READ_SLACK, but
    no more than :data:`LATE_REPLY` past its deadline. A reply cut short
    costs no grant (one not acknowledged goes back on its list)."""
    wait = block + READ_SLACK
    if deadline is None:
        return wait
    return min(wait, max(deadline - now, block) + LATE_REPLY)
