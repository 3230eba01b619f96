"""How much of a call is its commands: the commands an uncontended
``acquire`` + ``release`` and a ``renew`` send (``MONITOR`` shows them), in
the same order, with the same keys and arguments, sent by a bare Functions
library (:data:`REPLAY`) whose only Lua builds their arguments: no checks,
no records read into tables, no helpers. Measured beside the pool's own
calls on the same server, as ``callgrind_cost.py`` measures (callgrind, the
server's timer left out):

    python docs/scripts/callgrind_replay.py [N]

The difference is what the pool's Lua costs around its commands. The
replay reads ``redis.call`` once per call, as the pool's library does, and
takes what the pool reads from a record (the resource's name) as an
argument: a pattern match on a record would cost it more than some of its
commands. It mirrors the commands of the scripts as of 2026-11-27
(lua/README.md, "Globals read once, and one key declared"): a change of
what a grant sends needs a change here.
Needs valgrind (callgrind_control) and redis-server on PATH.
"""

from __future__ import annotations

import secrets
import sys

from callgrind_cost import Callgrind

from allocator import FairAllocator
from allocator._core.checks import default_owner
from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import declared, scripts

#: The commands of an uncontended acquire (it grants), a release (nobody
#: waits) and a renew, as the pool's scripts send them.
#: (``@SUFFIXES@``: the pool's key suffixes, KEY_SUFFIXES, put in at load.)
REPLAY = r"""#!lua name=callgrind_replay
-- The keys named from KEYS[1], kept per pool across calls, as the pool's
-- library names them.
local SUFFIXES = {@SUFFIXES@}
local NAMES = {}
local function names(KEYS)
  local k = NAMES[KEYS[1]]
  if not k then
    local b = string.sub(KEYS[1], 1, -5)
    k = {}
    for i, suffix in ipairs(SUFFIXES) do
      k[i] = b .. suffix
    end
    NAMES[KEYS[1]] = k
  end
  return k
end
redis.register_function('replay_acquire', function(KEYS, ARGV)
  local K, call = names(KEYS), redis.call
  local t = call('TIME')
  local us = t[1] * 1000000 + t[2]
  local now = (us - us % 1000) / 1000
  local now_s = t[1] .. string.sub('00000' .. t[2], -6)
  call('HGET', K[7], ARGV[1])
  call('HMGET', K[1], 'ev', 'hint', 'ord', 'nd', 'nh')
  call('XLEN', K[6])
  local best = call('ZRANGE', K[4], '0', '0')[1]
  local name = string.sub(best, 15)
  call('HGET', K[2], name)
  local id = call('XADD', K[6], 'MAXLEN', '0', '*', 'l', ARGV[1], 'c', ARGV[2], 't', ARGV[3],
    'o', ARGV[8])
  call('ZREM', K[4], best)
  call('HSET', K[2], name, '1|0|1|' .. now_s .. '|a|0||0|0|0')
  call('ZADD', K[14], '0', name .. '\0' .. ARGV[1])
  call('HINCRBY', K[15], 'w1', '1')
  local dl = string.format('%d', now + ARGV[3])
  call('HSET', K[7], ARGV[1], 'L|' .. id .. '|' .. now_s .. '|' .. now_s .. '|' .. dl ..
    '|' .. ARGV[3] .. '|' .. ARGV[2] .. '|0|' .. name .. '\0\0' .. ARGV[8])
  call('ZADD', K[8], dl, ARGV[1])
  return {'granted', id, now_s, now_s, now + ARGV[3], ARGV[3], name}
end)
redis.register_function('replay_release', function(KEYS, ARGV)
  local K, call = names(KEYS), redis.call
  local t = call('TIME')
  local us = t[1] * 1000000 + t[2]
  local now_s = t[1] .. string.sub('00000' .. t[2], -6)
  call('HMGET', K[1], 'ev', 'hint', 'ord', 'nd', 'nh')
  -- (The resource's name comes as ARGV[5]: the pool's Lua reads it from
  -- the record.)
  local name = ARGV[5]
  call('HGET', K[7], ARGV[1])
  call('HDEL', K[7], ARGV[1])
  call('ZREM', K[8], ARGV[1])
  call('ZREM', K[14], name .. '\0' .. ARGV[1])
  call('HGET', K[2], name)
  call('XLEN', K[6])
  local stamp = string.format('%014x', us)
  call('ZADD', K[4], '0', stamp .. name)
  call('HSET', K[2], name, '1|0|0|' .. now_s .. '|a|0|' .. stamp .. '|0|0|0')
  return {'released'}
end)
redis.register_function('replay_renew', function(KEYS, ARGV)
  local K, call = names(KEYS), redis.call
  local t = call('TIME')
  local us = t[1] * 1000000 + t[2]
  local now = (us - us % 1000) / 1000
  local rec = call('HGET', K[7], ARGV[1])
  call('HGET', K[2], ARGV[4])
  local dl = string.format('%d', now + ARGV[3])
  call('HSET', K[7], ARGV[1], rec)
  call('ZADD', K[8], dl, ARGV[1])
  return {'renewed', now + ARGV[3]}
end)
"""


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    scripts().enabled = True
    with Callgrind(n) as cg:
        client, measure = cg.client, cg.measure
        suffixes = ", ".join(f"'{suffix}'" for suffix in KEY_SUFFIXES)
        library = REPLAY.replace("@SUFFIXES@", suffixes)
        client.execute_command("FUNCTION", "LOAD", "REPLACE", library)

        # One pool for both: the replay works on the pool's own keys, so
        # that each command meets the same data as the pool's calls.
        pool = FairAllocator(client, "cg-replay")
        pool.extend(["a", "b"])
        for _ in range(50):
            pool.release(pool.acquire())
        # The keys the pool's own calls declare (META).
        cid = "p." + secrets.token_urlsafe(9)
        keys = declared(pool._pool.keys, False)
        owner = default_owner()

        def replay_cycle() -> None:
            lid = secrets.token_urlsafe(16)
            reply = client.execute_command(
                "FCALL", "replay_acquire", len(keys), *keys,
                lid, cid, 60_000, 12_000, "1", "", 0, owner,
            )  # fmt: skip
            client.execute_command(
                "FCALL", "replay_release", len(keys), *keys, lid, reply[1], "", "", reply[6]
            )

        def cycle() -> None:
            pool.release(pool.acquire())

        for _ in range(50):
            replay_cycle()
        replayed, real = measure(replay_cycle), measure(cycle)
        held = pool.acquire()

        def replay_renew() -> None:
            client.execute_command(
                "FCALL",
                "replay_renew",
                len(keys),
                *keys,
                held.id,
                held.ticket,
                60_000,
                held.resource,
            )

        def renew() -> None:
            pool.renew(held)

        renew_replayed, renew_real = measure(replay_renew), measure(renew)
        ping = measure(client.ping)
        print(f"{'':<26} {'commands only':>14} {'the pool':>10}   (instructions, PING {ping:,.0f})")
        print(f"{'acquire+release':<26} {replayed:>14,.0f} {real:>10,.0f}")
        print(f"{'renew':<26} {renew_replayed:>14,.0f} {renew_real:>10,.0f}")


if __name__ == "__main__":
    main()
