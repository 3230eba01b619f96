"""A pool: :class:`Pool`, the builder of every operation of one pool.

Its parts live in the modules that say what they decide: :mod:`.base`
(identity, keys, replies, retries), :mod:`.leasing` (acquire, renew,
release) and :mod:`.admin` (resources, quarantine, views, gc).
"""

from __future__ import annotations

from .admin import Admin
from .leasing import Leasing

__all__ = ["Pool"]


class Pool(Leasing, Admin):
    """A pool's identity and settings, and the builder of its operations:
    each method checks its arguments (before any I/O) and returns a flow of
    steps for a shell to carry out."""

    __slots__ = ()
