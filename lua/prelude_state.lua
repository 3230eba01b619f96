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

-- The state of one call: the keys, the clock, the resource records read in
-- this run (by name; false: not in the pool). Every time is the server's.
-- Scripts are replicated by their effects, so reading TIME here is safe.
-- `now_s` is the time in us as an exact string (Lua's own conversion keeps
-- only 14 digits), made without a string.format: every number formatted
-- costs a printf (~2-5k instructions), and most runs need none (see
-- P:now_stamp). Only what every call needs is made here: each field of this
-- table costs ~500 instructions per call (callgrind). What a run sets later
-- (META by P:meta, P:hint, P:now_stamp, the counters) starts from its
-- default below, among the helpers, and at most 32 fields in all keep the
-- table from growing mid-run (a rehash, ~10k instructions).
local P
do
  local t = redis.call('TIME')
  -- (Arithmetic turns the digits of TIME into numbers for about a third
  -- of what tonumber costs, a call of a global function.)
  local us = t[1] * 1000000 + t[2]
  P = {
    META = KEYS[1], RES = KEYS[2], GONE = KEYS[3], FREE = KEYS[4], PARK = KEYS[5],
    Q = KEYS[6], RECS = KEYS[7], EXP = KEYS[8], BIND = KEYS[9], BEXP = KEYS[10],
    ALIVE = KEYS[11], RLOG = KEYS[12], PICK = KEYS[13], HELD = KEYS[14], STATS = KEYS[15],
    -- (KEYS[16], the event log, is named where it is written: P:event;
    -- KEYS[17] to KEYS[19], the tenant index, by P:tkey.)
    SIG = KEYS[20],
    -- The caller's own signal list, where a script declares it (acquire,
    -- poll, cancel).
    OWN = KEYS[21],
    records = {},
    now_us = us, now = (us - us % 1000) / 1000, now_s = t[1] .. string.sub('00000' .. t[2], -6),
  }
end
