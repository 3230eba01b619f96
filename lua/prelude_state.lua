-- The prelude, prepended to every script of a pool: this file and the other
-- prelude_*.lua files, joined in the order of PRELUDE in
-- allocator/_scripts.py (lua/README.md, "The prelude"). It names the keys,
-- reads the clock once, and holds the helpers that every operation shares.
-- The key layout and the record formats are described in lua/README.md.
--
-- Cost notes (callgrind on redis-server 7.0; a trivial script is ~11k
-- instructions): Redis runs a script's whole body on every call, so every
-- helper closure is created on every call. The helpers are methods of one
-- table, P, and capture no local variables (a closure with upvalues costs
-- several times more to create). A redis.call costs ~4-7k instructions,
-- converting a number to a string ~5k: records keep their fields as strings
-- and only the fields that change are converted. Digits become a number for
-- ~800 by arithmetic (`s + 0`) against ~2k by tonumber, where they are
-- known to be digits; a pattern match costs ~80 per character (lua/README.md,
-- "Costs").

-- The names of the pool's keys. A call declares one key of the pool, META
-- (`<p>:meta`), and the others are named from it: every key of a pool
-- carries the same hash tag, so they live in the slot of the one declared,
-- and each key declared costs a call about 1,400 instructions (the server
-- copies it into KEYS). N is also the metatable of the state of a call,
-- which finds the names through it. They depend on KEYS[1] alone: the
-- Functions library makes them once per pool and keeps them across calls
-- (allocator/_scripts.py, library_text), so a call there names no key.
local N
do
  local b = string.sub(KEYS[1], 1, -5)
  N = {
    META = KEYS[1], RES = b .. 'res', GONE = b .. 'gone', FREE = b .. 'free',
    PARK = b .. 'park', Q = b .. 'q', RECS = b .. 'recs', EXP = b .. 'exp', BIND = b .. 'bind',
    BEXP = b .. 'bexp', ALIVE = b .. 'alive', RLOG = b .. 'rlog', PICK = b .. 'pick',
    HELD = b .. 'held', STATS = b .. 'stats',
    -- (The event log `<p>:events` is named where it is written, P:event;
    -- the tenant index, `<p>:tw`, `<p>:tq`, `<p>:tenants`, by P:key.)
    -- The prefix of the clients' signal lists, `<p>:s:`.
    SIG = b .. 's:',
  }
  N.__index = N
end

-- @call: above, the names of the keys; below, the state of one call.
-- The state of one call: the clock, the resource records read in this
-- run (by name; false: not in the pool). Every time is the server's.
-- Scripts are replicated by their effects, so reading TIME here is safe.
-- `now_s` is the time in us as an exact string (Lua's own conversion keeps
-- only 14 digits), made without a string.format: every number formatted
-- costs a printf (~2-5k instructions), and most runs need none (see
-- P:now_stamp). Only what most calls need is made here: each field of this
-- table costs ~500 instructions per call (callgrind), and each time it
-- grows (past 8 fields, then 16) a rehash costs ~3-5k. What a run sets
-- later (META by P:meta, P:hint, the counters) starts from its default
-- below, among the helpers.
local P
do
  local t = redis.call('TIME')
  -- (Arithmetic turns the digits of TIME into numbers for about a third
  -- of what tonumber costs, a call of a global function. The microseconds
  -- have six digits nine times in ten, and need no padding then.)
  local s, u = t[1], t[2]
  local us = s * 1000000 + u
  P = setmetatable({
    records = {},
    now_us = us, now = (us - us % 1000) / 1000,
    now_s = s .. (#u == 6 and u or string.sub('00000' .. u, -6)),
    -- Set by most runs (P:times, P:meta, P:now_stamp, P:hints: every
    -- grant), as their defaults are (prelude_defaults.lua): named here,
    -- they make the table 16 fields large from the start (more than 8), so
    -- that it does not grow mid-run (a rehash, about 1,500 instructions).
    nd = false, nh = 0, got_meta = false, stamp = false, hinted = false,
  }, N)
end
