"""The floor of a grant: what a queued, fenced, leased grant costs at the
least on Redis, as two ``FCALL`` of a bare Functions library that sends
only the commands such a grant needs. Its acquire adds a ticket to a
stream (``XADD``, the four fields of a pool's ticket), takes a free
resource (``ZPOPMIN``), draws its fencing token (``HINCRBY``), reads the
clock (``TIME``) and writes the lease record (``HSET``) and its deadline
(``ZADD``); its release reads the record (``HGET``) and deletes it
(``HDEL``), its deadline (``ZREM``) and its ticket (``XDEL``), and puts the
resource back (``ZADD``). No checks, no maintenance, no queue order, no
counters.

``allocator bench`` times its cycle next to the pool's (figure 1f), and
``docs/scripts/callgrind_cost.py`` counts its server instructions: what
the pool's own bookkeeping costs on top, in time and in work.
"""

from __future__ import annotations

import secrets
from typing import Any

import redis

from allocator._core.checks import default_owner

__all__ = ["FLOOR_LIBRARY", "Floor"]

#: The library. KEYS: the resources' fences (hash), the free resources
#: (zset), the queue (stream), the lease records (hash), the deadlines
#: (zset). ARGV of ``floor_acquire``: lease id, client id, ttl ms, owner; of
#: ``floor_release``: lease id.
FLOOR_LIBRARY = """#!lua name=allocator_bench_floor
redis.register_function('floor_acquire', function(KEYS, ARGV)
  local ticket = redis.call('XADD', KEYS[3], '*', 'l', ARGV[1], 'c', ARGV[2], 't', ARGV[3],
    'o', ARGV[4])
  local name = redis.call('ZPOPMIN', KEYS[2])[1]
  local token = redis.call('HINCRBY', KEYS[1], name, '1')
  local t = redis.call('TIME')
  local deadline = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[3])
  redis.call('HSET', KEYS[4], ARGV[1], ticket .. '|' .. token .. '|' .. name)
  redis.call('ZADD', KEYS[5], deadline, ARGV[1])
  return {ticket, token, deadline, name}
end)
redis.register_function('floor_release', function(KEYS, ARGV)
  local ticket, name = string.match(redis.call('HGET', KEYS[4], ARGV[1]), '^([^|]*)|[^|]*|(.*)$')
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
  redis.call('XDEL', KEYS[3], ticket)
  redis.call('ZADD', KEYS[2], '0', name)
  return 1
end)
"""

_LIBRARY_NAME = "allocator_bench_floor"


class Floor:
    """The floor's cycle (``floor_acquire`` + ``floor_release``) on a pool of
    two resources, with lease ids and an owner as a pool's calls send them;
    its keys are ``<base>:<part>`` (``base`` carries the hash tag). Loads
    the library on ``client``'s server; :meth:`close` deletes it and the
    keys."""

    def __init__(self, client: Any, base: str) -> None:
        self.client = client
        client.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
        self.keys = [f"{base}:{part}" for part in ("fence", "free", "q", "recs", "exp")]
        client.zadd(self.keys[1], {"a": 0, "b": 0})
        self.cid = secrets.token_urlsafe(9)
        self.owner = default_owner()

    @classmethod
    def start(cls, client: Any, base: str) -> Floor | None:
        """A floor on ``client``'s server, or None where the server (Redis
        before 7.0) or the user's ACL has no Functions."""
        try:
            return cls(client, base)
        except redis.ResponseError:
            return None

    def once(self) -> None:
        lid = secrets.token_urlsafe(16)
        keys = self.keys
        self.client.execute_command(
            "FCALL", "floor_acquire", len(keys), *keys, lid, self.cid, 60_000, self.owner
        )
        self.client.execute_command("FCALL", "floor_release", len(keys), *keys, lid)

    def close(self) -> None:
        self.client.delete(*self.keys)
        self.client.execute_command("FUNCTION", "DELETE", _LIBRARY_NAME)
