"""The messages of the signal-list protocol: their formats, and the one
place they are read (lua/README.md, "Messages on a signal list" and
"Messages on a presence channel", is the scripts' side).

A pool's scripts push messages onto the signal list of a waiting client
(``<prefix>:{<name>}:s:<client id>``). The client's reader pops them and
routes each to the waiter it names by lease id (:meth:`.reader.Reader.route`,
with :func:`target`); the waiter reads what it means for it
(:func:`for_waiter`; :meth:`.base.PoolBase._message` makes a grant a
``Lease``). Each kind is named by its prefix:

- ``g|<lease id>|<ticket>|<token>|<granted_us>|<ttl_ms>|<resource>``
  (:data:`GRANT`): a grant, one per lease (a grant of ``acquire_many``
  pushes one for each of its leases in one script run). The resource is
  the last field, and may hold ``|``.
- ``h|<lease id>|<delay ms>`` (:data:`HINT`): to the queue head: nothing
  can be granted now, look again in that many ms.
- ``x|<lease id>`` (:data:`TAKEN_BACK`): the grant of that waiter was
  taken back while its client looked gone: look again at once.
- ``d|<lease id>`` (:data:`DELETED`): the pool was deleted
  (``delete(force=True)``) while that waiter waited: give up, and never
  queue again.

The reader puts one of its own in a waiter's inbox: ``r|``
(:data:`RECHECK`), look again (poll) once.

On a client's presence channel (``<prefix>:{<name>}:p:<client id>``,
:mod:`.presence`), a script that ends a lease of the client other than by
its release publishes ``e|<lease id>`` (:data:`ENDED`): the holder must
give it up (:meth:`.presence.Holds.heard`).

A lease id of ``acquire_many`` names its request: the request's own id for
its first lease, then ``<id>.2``, ``<id>.3``... (:func:`many_id`); a
message for any of them goes to the request's waiter (:func:`request_of`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .replies import _decode

#: The prefixes that name each kind of message (see the module's docstring).
GRANT = "g|"
HINT = "h|"
TAKEN_BACK = "x|"
#: Also what :func:`for_waiter` makes of a ``d|<lease id>`` notice: the pool
#: was deleted while this requester waited.
DELETED = "d|"
#: Put in a waiter's inbox by its reader to make it look again (poll) once;
#: also what :func:`for_waiter` makes of a ``x|<lease id>`` notice.
RECHECK = "r|"
ENDED = "e|"


class Grant(NamedTuple):
    """The fields of a grant message, as the message writes them."""

    lease_id: str
    ticket: str
    token: str
    granted_us: str
    ttl_ms: str
    resource: str


def grant_of(message: Any) -> Grant | None:
    """The grant ``message`` is (None if it is no grant, or out of shape)."""
    text = _decode(message)
    if not text.startswith(GRANT):
        return None
    fields = text[len(GRANT) :].split("|", 5)
    if len(fields) != 6:
        return None
    return Grant(*fields)


def target(message: Any) -> str:
    """The lease id a message is for, by which the reader routes it ('' if
    it names none)."""
    parts = _decode(message).split("|", 2)
    return parts[1] if len(parts) > 1 else ""


def for_waiter(
    message: Any, lid: str, ticket: str, count: int | None = None
) -> Grant | float | str | None:
    """What ``message`` means to the waiter of request ``lid`` on ``ticket``:
    its grant, a hint (seconds until it should look again), :data:`RECHECK`,
    :data:`DELETED`, or None for anything stale. A waiter of acquire_many
    (``count``) takes the grant of any of its leases: the first on its own
    ticket, the others on the entries behind it."""
    text = _decode(message)
    if text == RECHECK:
        return RECHECK
    if text.startswith(GRANT):
        grant = grant_of(text)
        if grant is not None and (
            (grant.lease_id == lid and grant.ticket == ticket)
            or (
                count is not None
                and _many_index(grant.lease_id, lid) in range(1, count)
                and _stream_id(grant.ticket) > _stream_id(ticket)
            )
        ):
            return grant
    elif text.startswith(HINT):
        to, _, delay = text[len(HINT) :].partition("|")
        if to == lid:
            return int(delay) / 1000
    elif text.startswith(TAKEN_BACK) and request_of(text[len(TAKEN_BACK) :]) == lid:
        # The grant was taken back while this client looked gone: the
        # waiter must look again (and queue again) at once.
        return RECHECK
    elif text.startswith(DELETED) and request_of(text[len(DELETED) :]) == lid:
        # The pool was deleted (delete(force=True)): give up, and never
        # queue again (that would make the pool anew). For acquire_many,
        # the notice may name any lease of the request.
        return DELETED
    return None


def ended_lease(message: str) -> str | None:
    """The lease whose end a presence-channel message tells (None: it tells
    no end)."""
    return message[len(ENDED) :] if message.startswith(ENDED) else None


def many_id(lid: str, index: int) -> str:
    """The lease id of resource ``index`` (from 0) of the acquire_many
    request ``lid`` (lua/prelude_many.lua ``P.many_id``): ``lid`` itself, then
    ``<lid>.2``, ``<lid>.3``... A lease id from ``secrets.token_urlsafe``
    never holds a dot, so the request's own id is the part before it."""
    return lid if index == 0 else f"{lid}.{index + 1}"


def _many_index(lease_id: str, lid: str) -> int:
    """The index (from 0) of ``lease_id`` in the request ``lid``, or -1."""
    base, dot, number = lease_id.partition(".")
    if base != lid:
        return -1
    if not dot:
        return 0
    return int(number) - 1 if number.isdigit() and number.isascii() else -1


def request_of(lease_id: str) -> str:
    """The request (waiter) a lease id belongs to: see :func:`many_id`."""
    return lease_id.partition(".")[0]


def _stream_id(text: str) -> tuple[int, int]:
    """A stream id ``ms-seq`` (a ticket) as a pair that orders as the
    stream does."""
    first, _, second = text.partition("-")
    try:
        return int(first), int(second)
    except ValueError:
        return -1, -1
