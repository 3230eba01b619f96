"""A pool's leasing operations: the waiting flow of ``acquire`` and
``acquire_many`` (queue, wait for a push or a hint, look again, leave the
queue when giving up), ``renew`` and ``release``."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any, cast

import attrs

from .._values import Lease
from ..errors import AcquireTimeout, LeaseLost
from .base import PoolBase
from .checks import MAX_RESOURCE, _count, _ms, _owner, _seconds, _tenant, _text, _timeout
from .clients import client_info
from .liveness import HEARTBEAT
from .messages import DELETED, RECHECK, many_id
from .pending import RIDE_OUT, cancel_end, end_key, release_end, renew_budget
from .presence import WAITER_BACKOFF, alive_ms
from .replies import _BUSY, _GONE, State, _tagged, _unexpected
from .retry import SIDE_BUDGET, is_transient, retry_single, retrying
from .steps import Call, Defer, Flow, Pending, Settle, Wait


def _never(lease: Lease) -> bool:
    """Nothing was given up (the default of release and renew)."""
    return False


class Leasing(PoolBase):
    """Acquire, renew and release (see :class:`~.pool.Pool`)."""

    __slots__ = ()

    # -- acquire --------------------------------------------------------------

    def acquire(
        self,
        timeout: object,
        ttl: object,
        bind: object,
        blocking: object,
        *,
        cid: str,
        owner: object = None,
        started: float | None = None,
        tenant: object = None,
    ) -> Acquire:
        """Check the arguments and build an acquire: its steps, and the lease
        id under which the client's reader routes messages to it. ``cid`` is
        the client id of the reader (:class:`~.reader.Reader`) that serves it;
        ``started`` (monotonic seconds) when the caller's wait began, if
        before the flow's first step (the time the shell spent setting up
        the client's presence counts against the timeout). ``tenant``: who
        the request is for (None: the pool's default, :attr:`tenant`)."""
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
        wait = _timeout(timeout)
        ttl_ms = self._ttl_ms(ttl)
        bind_name = None if bind is None else _text("bind", bind, MAX_RESOURCE)
        holder = _owner(owner)
        who = self.tenant if tenant is None else _tenant(tenant)
        lid = secrets.token_urlsafe(16)
        steps = self._acquire(
            lid, cid, wait, ttl_ms, bind_name, blocking, holder, None, started, who
        )
        # One flow for both kinds; a single acquire only ever returns one
        # lease (no wrapper generator: every level of `yield from` costs
        # each step of the hot path).
        return Acquire(lid=lid, steps=cast("Flow[Lease | None]", steps))

    def acquire_many(
        self,
        count: object,
        timeout: object,
        ttl: object,
        blocking: object,
        *,
        cid: str,
        owner: object = None,
        started: float | None = None,
        tenant: object = None,
    ) -> AcquireMany:
        """Same as :meth:`acquire`, for ``count`` resources at once, all or
        nothing: one request in the same queue, granted at the head when
        ``count`` resources are free at once (see lua/acquire_many.lua)."""
        number = _count(count)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, not {type(blocking).__name__}")
        wait = _timeout(timeout)
        ttl_ms = self._ttl_ms(ttl)
        holder = _owner(owner)
        who = self.tenant if tenant is None else _tenant(tenant)
        lid = secrets.token_urlsafe(16)
        steps = self._acquire(lid, cid, wait, ttl_ms, None, blocking, holder, number, started, who)
        return AcquireMany(lid=lid, count=number, steps=cast("Flow[list[Lease] | None]", steps))

    def _acquire(
        self,
        lid: str,
        cid: str,
        timeout: float | None,
        ttl_ms: int,
        bind: str | None,
        blocking: bool,
        owner: str,
        count: int | None,
        started: float | None = None,
        tenant: str = "",
    ) -> Flow[Lease | list[Lease] | None]:
        """The one waiting flow, of ``acquire`` (``count`` None) and of
        ``acquire_many`` (the leases of ``count`` resources: it returns once
        it has all of them, from one reply or from ``count`` pushes)."""
        started = time.monotonic() if started is None else started
        deadline = None if timeout is None else started + timeout
        if not blocking and deadline is None:
            # A non-blocking call never waits in line: give its retries the
            # same short budget as any single call (docs/api.md#errors).
            deadline = started + self.call_budget
        mark_ms = alive_ms(cid)
        flag = "1" if blocking else "0"
        # Sent only where it is on, so that the common acquire stays as it was.
        reclaim: tuple[str, ...] = ("1",) if self.reclaim_on_disconnect else ()
        # The client's first acquire in the pool says who it is (clients()).
        introduce = cid not in self._introduced
        if introduce:
            reclaim = (reclaim or ("0",)) + (client_info(),)
        if tenant:
            # The last argument, after the two before it (lua/acquire.lua).
            flag_r = "1" if self.reclaim_on_disconnect else "0"
            reclaim = (flag_r, reclaim[1] if len(reclaim) > 1 else "", tenant)
        many: tuple[str | int, ...] = ()
        if count is None:
            enqueue: Call[State] = Call(
                "acquire",
                self.keys,
                (lid, cid, ttl_ms, mark_ms, flag, bind or "", _ms(self.bind_ttl), owner, *reclaim),
                lambda reply: self._state("acquire", lid, reply),
            )
        else:
            many = ("", count)  # poll's probe (none) and count
            enqueue = Call(
                "acquire_many",
                self.keys,
                (lid, cid, ttl_ms, mark_ms, flag, count, owner, *reclaim),
                lambda reply: self._state("acquire_many", lid, reply),
            )
        poll: Call[State] | None = None  # made when first needed: most acquires never wait
        # Grants of acquire_many pushed one lease at a time, by lease id.
        got: dict[str, Lease] = {}
        deleted = False
        # The reader's last error while it fails, if it does, when a wait ends.
        trouble: BaseException | None = None

        def attempt(call: Call[State]) -> Flow[State]:
            # While this flow retries a look, it does not lead its client's
            # reader rounds (allocator/_core/lead.py): if it alone waits in
            # its process, nobody else subscribes the client again after an
            # outage (presence.WAITER_BACKOFF, as the reader's own retries).
            try:
                if not self.min_replicas:
                    return (
                        yield from retrying(
                            call, deadline=deadline, per_try=self.try_budget, cap=WAITER_BACKOFF
                        )
                    )
                return (yield from self._look_confirmed(call, deadline))
            except Exception as exc:
                if blocking and timeout is not None and is_transient(exc):
                    # Out of time while the server was unreachable: the
                    # caller's timeout ran out; the error is its cause.
                    raise AcquireTimeout(self.name, time.monotonic() - started) from exc
                raise

        try:
            # A lost reply is retried with the same lease id: the script finds
            # the first attempt's ticket, so the requester keeps its place.
            state = yield from attempt(enqueue)
            if introduce:
                self._introduced.add(cid)
            if state == _BUSY:
                return None
            while True:
                if isinstance(state, (Lease, list)):
                    return state
                got.clear()
                if state == _GONE:
                    # The ticket left the queue without us (the pool's data was
                    # lost, or we looked dead for too long): queue again.
                    state = yield from attempt(enqueue)
                    continue
                assert isinstance(state, tuple)
                ticket, hint = state
                wake_at = None if hint is None else time.monotonic() + hint
                # Wait for a push; look again (poll) when the hint comes due or
                # the reader asks for it. The reader keeps us alive meanwhile.
                while True:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise AcquireTimeout(self.name, now - started) from trouble
                    limits = [t - now for t in (deadline, wake_at) if t is not None]
                    span = min(limits) if limits else None
                    if span is not None and span <= 0:
                        break
                    message = yield Wait(lid, span)
                    if message is None or isinstance(message, BaseException):
                        # Nothing came: the reply to a Wait that ran out is
                        # the reader's trouble, if it has any.
                        trouble = message
                        if deadline is not None and time.monotonic() >= deadline:
                            continue
                        break
                    seen = self._message(message, lid, ticket, count)
                    if isinstance(seen, Lease) and count is None:
                        if not self.min_replicas:
                            return seen
                        confirmed = yield from self._confirm_pushed(seen, deadline)
                        if confirmed is not None:
                            return confirmed
                        break  # taken back meanwhile: look again
                    if isinstance(seen, Lease):
                        # One script run pushed them all: the others follow,
                        # normally in the same batch. If one never comes (it
                        # ended before it was popped: its message went with
                        # it), a look within a heartbeat settles it: all the
                        # leases, or none and a place at the back.
                        got[seen.id] = seen
                        if len(got) == count:
                            leases = [got[many_id(lid, i)] for i in range(count)]
                            if not self.min_replicas:
                                return leases
                            all_confirmed = yield from self._confirm_pushed_many(leases, deadline)
                            if all_confirmed is not None:
                                return all_confirmed
                            break  # some taken back meanwhile: look again
                        soon = time.monotonic() + HEARTBEAT
                        wake_at = soon if wake_at is None else min(wake_at, soon)
                        continue
                    if isinstance(seen, float):
                        wake_at = time.monotonic() + seen
                    elif seen == DELETED:
                        deleted = True
                        raise AcquireTimeout(self.name, time.monotonic() - started)
                    elif seen == RECHECK:
                        break
                if poll is None:
                    poll = Call(
                        "poll",
                        self.keys,
                        (lid, cid, mark_ms, *many),
                        lambda reply: self._state("poll", lid, reply),
                    )
                state = yield from attempt(poll)
        except GeneratorExit:
            raise
        except BaseException as exc:
            # Giving up (timeout, cancellation, KeyboardInterrupt, an error):
            # leave the queue, and pass on a grant that raced in. One short
            # try of its own (the deadline has passed): if it fails, the
            # ticket's liveness runs out and dispatch drops it. A deleted
            # pool holds no ticket: a cancel would only make keys.
            if deleted:
                raise
            cancel = Call(
                "cancel", self.keys, (lid, *many[1:]), lambda reply: _tagged("cancel", reply)
            )
            try:
                due = time.monotonic() + SIDE_BUDGET
                yield from retrying(cancel, attempts=1, deadline=due)
            except Exception as error:
                if is_transient(error):
                    # It may not have reached the server, and the enqueue
                    # may still run there (a stalled server runs what it
                    # finds buffered): sent again in the background as soon
                    # as the server answers (allocator/_core/pending.py).
                    now = time.monotonic()
                    yield Defer(cancel_end(self.name, self.keys, cancel, lid, ttl_ms / 1000, now))
            if isinstance(exc, AcquireTimeout):
                # The caller waited for the cancel too: say the whole time.
                raise AcquireTimeout(self.name, time.monotonic() - started) from exc.__cause__
            raise

    def _look_confirmed(self, call: Call[State], deadline: float | None) -> Flow[State]:
        """Run an acquire or poll call with ``min_replicas``: a grant in its
        reply counts only once confirmed, else it is released and
        :class:`NotReplicated` raised."""
        state, replicas = yield from retrying(
            self._confirmed(call), deadline=deadline, per_try=self.try_budget, cap=WAITER_BACKOFF
        )
        if isinstance(state, Lease) and replicas < self.min_replicas:
            raise (yield from self._give_back(state, replicas))
        if isinstance(state, list) and replicas < self.min_replicas:
            # acquire_many: all of them go back, and the first error is raised.
            errors = []
            for lease in state:
                errors.append((yield from self._give_back(lease, replicas)))
            raise errors[0]
        return state

    def _confirm_pushed_many(
        self, leases: list[Lease], deadline: float | None
    ) -> Flow[list[Lease] | None]:
        """:meth:`_confirm_pushed` for the leases of an acquire_many grant:
        all of them confirmed, or None if one is no longer this waiter's
        (its next look ends the others). A NotReplicated goes out to the
        flow, whose cancel ends every lease of the request."""
        confirmed = []
        for lease in leases:
            renewed = yield from self._confirm_pushed(lease, deadline)
            if renewed is None:
                return None
            confirmed.append(renewed)
        return confirmed

    def _confirm_pushed(self, lease: Lease, deadline: float | None) -> Flow[Lease | None]:
        """Confirm a grant pushed to this waiter by another client's script:
        a confirmed renew of it (see :func:`confirm_commands` for why that
        covers the grant). None if the grant is no longer this waiter's."""
        renew = self._confirmed(self._renew_call(lease, _ms(lease.ttl)))
        if deadline is None or deadline - time.monotonic() < self.call_budget:
            deadline = time.monotonic() + self.call_budget
        try:
            renewed, replicas = yield from retrying(
                renew, deadline=deadline, per_try=self.try_budget
            )
        except LeaseLost:
            return None
        if replicas < self.min_replicas:
            raise (yield from self._give_back(renewed, replicas))
        return renewed

    # -- renew and release ---------------------------------------------------

    def release(
        self, lease: object, quarantine: object, gave_up: Callable[[Lease], bool] = _never
    ) -> Flow[bool]:
        """``gave_up``: whether this process gave the lease up (its
        presence watch, allocator/_core/presence.py); such a lease is
        released all the same, and the flow returns False whatever the
        server says, or if it cannot be reached."""
        held = self._check_lease(lease)
        q_ms = "" if quarantine is None else str(_ms(_seconds("quarantine", quarantine, minimum=0)))

        def parse(reply: Any) -> bool:
            tag, rest = _tagged("release", reply)
            if rest or tag not in ("released", "lost"):
                raise _unexpected("release", reply)
            return tag == "released"

        flow = self._ending(
            Call("release", self.keys, (held.id, held.ticket, q_ms, ""), parse), held
        )
        return _released_anyway(flow) if gave_up(held) else flow

    @property
    def end_budget(self) -> float:
        """How long ``release`` and ``renew`` keep trying: a pause or a
        stall of a few seconds is ridden out (:data:`~.pending.RIDE_OUT`)."""
        return max(self.call_budget, RIDE_OUT)

    def _ending(self, call: Call[bool], held: Lease) -> Flow[bool]:
        """A release: within :attr:`end_budget`; if it gives up on a
        transport error (its outcome unknown), it is handed to the client's
        background sender before the error goes out, so that the resource
        comes back as soon as the server answers
        (docs/api.md#allocator.FairAllocator.release).
        An answer settles any release of the lease still pending."""
        try:
            released = yield from retry_single(call, self.end_budget, self.try_budget)
        except Exception as exc:
            if is_transient(exc):
                yield Defer(release_end(self.name, call, held, time.monotonic()))
            raise
        yield Settle(end_key(self.keys, held.id))
        return released

    def renew(
        self, lease: object, ttl: object, gave_up: Callable[[Lease], bool] = _never
    ) -> Flow[Lease]:
        """``gave_up`` as for :meth:`release`: such a lease is not renewed;
        LeaseLost is raised here, before any I/O."""
        held = self._check_lease(lease)
        ttl_ms = _ms(_seconds("lease.ttl", held.ttl) if ttl is None else _seconds("ttl", ttl))
        if gave_up(held):
            raise self._given_up(held)
        return self._renewing(held, ttl_ms)

    def _renewing(self, held: Lease, ttl_ms: int) -> Flow[Lease]:
        """A renew, within :func:`~.pending.renew_budget`. A lease whose release is
        still to be delivered is not renewed (LeaseLost, before any I/O):
        the release may reach the server after the renewal."""
        if (yield Pending(end_key(self.keys, held.id))):
            raise LeaseLost(
                self.name,
                held.resource,
                held.token,
                "released: its release is still being delivered "
                "(docs/api.md#allocator.FairAllocator.release)",
            )
        call = self._renew_call(held, ttl_ms)
        budget = renew_budget(self.call_budget, held.ttl)
        if not self.min_replicas:
            return (yield from retry_single(call, budget, self.try_budget))
        return (yield from self._renew_confirmed(call, held, budget))

    def _renew_confirmed(self, call: Call[Lease], held: Lease, budget: float) -> Flow[Lease]:
        renewed, replicas = yield from retry_single(self._confirmed(call), budget, self.try_budget)
        if replicas < self.min_replicas:
            # The lease stays as the primary has it (renewed there).
            raise self._not_replicated(held, replicas, "renew")
        return renewed

    def _renew_call(self, held: Lease, ttl_ms: int) -> Call[Lease]:
        def parse(reply: Any) -> Lease:
            tag, rest = _tagged("renew", reply)
            if tag == "renewed" and len(rest) == 1:
                return attrs.evolve(held, expires_at=int(rest[0]) / 1000, ttl=ttl_ms / 1000)
            if tag == "lost" and not rest:
                raise LeaseLost(
                    self.name, held.resource, held.token, "expired, revoked or released"
                )
            raise _unexpected("renew", reply)

        return Call("renew", self.keys, (held.id, held.ticket, ttl_ms), parse)

    def _given_up(self, lease: Lease) -> LeaseLost:
        """What ``renew`` raises for a lease this process knows it lost
        (``lost()``, allocator/_core/presence.py): the server told it so on
        its presence connection, or the lease ends with its holder's
        presence (``reclaim_on_disconnect``), which went unconfirmed for
        longer than the grace."""
        return LeaseLost(
            self.name,
            lease.resource,
            lease.token,
            "given up: the server said it ended (revoked or reclaimed), or this process's "
            "presence was unconfirmed for longer than the grace, so the server may have "
            "ended it (reclaim_on_disconnect)",
        )

    def lost_many(
        self,
        held: list[Lease],
        released: list[bool | BaseException],
        losses: list[LeaseLost | None],
    ) -> BaseException | None:
        """What the exit of ``lease_many`` raises, if anything: the first
        LeaseLost a keeper met, else a LeaseLost for the first lease whose
        release found it ended, else the first error a release raised (every
        release was tried). ``released`` holds each release's result or
        error; ``losses`` each keeper's LeaseLost or None."""
        lost = next((loss for loss in losses if loss is not None), None)
        if lost is not None:
            return lost
        for lease, result in zip(held, released, strict=True):
            if result is False:
                return LeaseLost(self.name, lease.resource, lease.token, "lost while held")
        return next((r for r in released if isinstance(r, BaseException)), None)


def _released_anyway(flow: Flow[bool]) -> Flow[bool]:
    """The release of a lease this process gave up: tried all the same (it
    frees the resource at once where the server can be reached), False
    whatever comes of it."""
    with contextlib.suppress(Exception):
        yield from flow
    return False


@attrs.frozen
class Acquire:
    """An acquire ready to be driven: the lease id its messages are routed
    by, and its steps."""

    lid: str
    steps: Flow[Lease | None] = attrs.field(repr=False)


@attrs.frozen
class AcquireMany:
    """An acquire_many ready to be driven: the request's id (its messages,
    one per lease, are routed by it: :func:`~.messages.request_of`), and its steps."""

    lid: str
    count: int
    steps: Flow[list[Lease] | None] = attrs.field(repr=False)
