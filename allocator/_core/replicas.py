"""Confirming writes on replicas (docs/operations.md#replicas-min_replicas):
the pipeline of a confirmed call and the reading of its replies, and what a
pool does with the count (:class:`Confirmation`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar

from redis.exceptions import AskError, ClusterError, MovedError

from .._values import Lease
from ..errors import AllocatorError, NotReplicated
from .checks import _ms
from .replies import _decode
from .retry import SingleCalls
from .steps import Call, Flow

_log = logging.getLogger("allocator")

T = TypeVar("T")


#
# Redis's WAIT counts the replicas that acknowledged the replication offset
# of the *calling connection's* last write (its ``woff``), not every write
# the server had when WAIT came: a WAIT on a connection that wrote nothing,
# or wrote long ago, answers at once with a count that says nothing about a
# grant some other client's script made. So a confirmed call is sent as
#
#     EVALSHA <script> ...; HINCRBY <meta> wseq 1; WAIT <replicas> <ms>
#
# in one pipeline on one connection. HINCRBY always changes the server (a
# script that found nothing to do, or an acquire retried after a lost reply
# that finds its grant made by the first try, may write nothing), so it is
# always replicated, and it runs after the script on the same master: the
# replication stream is ordered, so a replica that acknowledged it has every
# write the script saw, the grant among them, whoever made it. The same holds
# for a grant pushed to a waiter by another client's release: the waiter
# confirms it with a confirmed ``renew`` of the lease, whose script reads the
# grant (so runs after it) before the marker and the WAIT.
class Confirmed(NamedTuple):
    """The reply of a confirmed call: the script's reply and how many
    replicas acknowledged it (WAIT's answer)."""

    reply: Any
    replicas: int


#: The field of the pool's META hash that the confirmation marker bumps.
CONFIRM_FIELD = "wseq"


#: The commands that run a script (``Scripts.invoke`` yields one of them,
#: after a ``FUNCTION LOAD`` perhaps).
SCRIPT_COMMANDS = frozenset({"FCALL", "FCALL_RO", "EVALSHA", "EVAL"})


def confirm_commands(call: Call[Any], command: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The pipeline of a confirmed call: the script ``command`` (FCALL,
    EVALSHA or EVAL), the marker write, WAIT."""
    assert call.confirm is not None, "not a confirmed call"
    replicas, timeout_ms = call.confirm
    return [
        command,
        ("HINCRBY", call.keys[0], CONFIRM_FIELD, 1),
        ("WAIT", replicas, timeout_ms),
    ]


def confirming(
    call: Call[Any], commands: Generator[tuple[Any, ...], Any, Any]
) -> Generator[tuple[Any, ...] | list[tuple[Any, ...]], Any, Confirmed]:
    """The commands of a confirmed call: those of ``commands`` (the
    script's, from ``Scripts.invoke``), each script command sent as the
    pipeline of :func:`confirm_commands` (a list: the shells send it on one
    connection and send back the replies, errors as values). The script's
    reply or error goes back to ``commands``, which decides (NOSCRIPT: by
    text; a missing library: load it); returns the script's reply and the
    replicas that confirmed it."""
    replicas = 0
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            command = commands.send(reply) if error is None else commands.throw(error)
        except StopIteration as stop:
            return Confirmed(stop.value, replicas)
        reply, error = None, None
        if _decode(command[0]).upper() not in SCRIPT_COMMANDS:
            try:
                reply = yield command
            except Exception as exc:
                error = exc
            continue
        replies = yield confirm_commands(call, command)
        if len(replies) != 3:
            raise AllocatorError(f"unexpected replies to a confirmed call: {replies!r}")
        check_slot(replies)
        script, marker, acked = replies
        for item in (marker, acked):
            if isinstance(item, Exception):
                raise item
        if isinstance(script, Exception):
            error = script
            continue
        reply, replicas = script, int(acked)


def check_slot(replies: list[Any]) -> None:
    """Replies of a pipeline sent to one cluster node: a MOVED or ASK among
    them (the pool's slot moved, or is moving, to another node) is raised
    as a transient ``ClusterError``, like TRYAGAIN: the shell has learnt the
    slots again (:func:`moved`), and the next try goes to the new master."""
    for item in replies:
        if isinstance(item, (MovedError, AskError)):
            raise ClusterError(f"the pool's slot is moving: {item}") from item


def moved(replies: list[Any]) -> bool:
    """A confirmed call sent to a cluster node that no longer serves the
    pool's slot: the shell refreshes its slot map (:func:`confirming` then
    raises a transient error, and the flow tries again)."""
    return any(isinstance(reply, MovedError) for reply in replies)


class Confirmation(SingleCalls):
    """A pool's confirmation of its grants and renewals on replicas
    (``min_replicas``): a part of :class:`~.base.PoolBase`, whose settings
    say how many replicas and how long to wait for them."""

    __slots__ = ()

    #: See :class:`.base.PoolBase`.
    name: str
    keys: tuple[str, ...]
    min_replicas: int
    replica_timeout: float

    def _confirmed(self, call: Call[T]) -> Call[tuple[T, int]]:
        """``call`` sent with the confirmation of :func:`confirm_commands`;
        its parse gives the parsed reply and the replicas that confirmed."""
        parse = call.parse

        def both(reply: Confirmed) -> tuple[T, int]:
            return parse(reply.reply), reply.replicas

        confirm = (self.min_replicas, _ms(self.replica_timeout))
        return Call(call.script, call.keys, call.args, both, confirm=confirm)

    def _not_replicated(self, lease: Lease, replicas: int, what: str) -> NotReplicated:
        return NotReplicated(
            self.name, lease.resource, lease.token, replicas, self.min_replicas, what
        )

    def _give_back(self, lease: Lease, replicas: int) -> Flow[NotReplicated]:
        """A grant that too few replicas confirmed: release it (so nothing
        leaks; a failover that loses it loses nothing either) and return
        the error to raise."""
        _log.warning(
            "allocator: pool %r: grant of %r confirmed by %d of %d replicas; released",
            self.name,
            lease.resource,
            replicas,
            self.min_replicas,
        )
        release = Call("release", self.keys, (lease.id, lease.ticket, "", ""), lambda r: r)
        with contextlib.suppress(Exception):
            # Not confirmed itself: if this release is lost in a failover,
            # the lease ends at its deadline as any unreleased lease does.
            yield from self._single(release)
        return self._not_replicated(lease, replicas, "acquire")
