-- prelude.lua: prepended to every script of a pool. It names the keys, reads
-- the clock once, and holds the helpers that every operation shares. The key
-- layout and the record formats are described in lua/README.md.
--
-- Cost notes (callgrind on redis-server 7.0; a trivial script is ~11k
-- instructions): Redis runs a script's whole body on every call, so every
-- helper closure is created on every call. The helpers are methods of one
-- table, P, and capture no local variables (a closure with upvalues costs
-- several times more to create). A redis.call costs ~4-7k instructions,
-- converting a number to a string ~5k: records keep their fields as strings
-- and only the fields that change are converted.

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
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  P = {
    META = KEYS[1], RES = KEYS[2], GONE = KEYS[3], FREE = KEYS[4], PARK = KEYS[5],
    Q = KEYS[6], RECS = KEYS[7], EXP = KEYS[8], BIND = KEYS[9], BEXP = KEYS[10],
    ALIVE = KEYS[11], RLOG = KEYS[12], PICK = KEYS[13], HELD = KEYS[14], STATS = KEYS[15],
    -- (KEYS[16], the event log, is named where it is written: P:event.)
    SIG = KEYS[17],
    -- The caller's own signal list, where a script declares it (acquire,
    -- poll, cancel).
    OWN = KEYS[18],
    records = {},
    now_us = us, now = math.floor(us / 1000), now_s = t[1] .. string.sub('00000' .. t[2], -6),
  }
end

-- @helpers: above, the state of one call; below, the helpers. As a script
-- (EVALSHA) all of it runs on every call; in the Functions library
-- (allocator/_scripts.py) the helpers are defined once, when the library
-- loads, and each call only builds its state, which finds them through a
-- metatable. So the helpers keep no state of their own: only `self`.

-- Constants, and the defaults of the state a run sets as it goes (in the
-- Functions library these are the helpers' own, found through the
-- metatable until a run sets its own value).
-- A grant pushed to a waiter's signal list is checked this long after, and
-- again as long as its client's reader has not acknowledged it: while the
-- client is alive, the grant is put back on its list if a lost reply took
-- it; once the client's liveness has run out, the grant is taken back.
P.PICKUP_MS = 2000
-- A client that keeps a presence (its id starts with 'p.': a connection
-- subscribed to its channel, lua/README.md) and that a run has found
-- absent, no subscriber on that channel, is gone this long after it was
-- first found so: long enough for a reconnect (a restart or a failover
-- drops every connection at once), short enough that a dead waiter holds
-- nobody up for long. GRACE in allocator/_core/liveness.py.
P.GRACE_MS = 1000
-- A lease whose holder asked for it to end when its process is gone
-- (`reclaim_on_disconnect`: its ticket has the field `e`, and its client
-- keeps a presence) has its holder's presence checked this often, by a
-- PICK entry `c|<lease id>` (P:check_holder).
P.CHECK_MS = 500
-- Dead tickets dropped from the head of the queue per script run, so that
-- a crowd of dead waiters never blocks the server (200 drops take about
-- 3 ms on Redis 7.0); whoever runs next goes on (a waiter's reply says
-- "look again now", a reader beats again at once).
P.DROP_LIMIT = 200
-- Clients whose presence a run checks, beyond the one it found absent, so
-- that a crowd that died together (a node lost, a rolling restart) has its
-- graces run together instead of one after another as each reaches the
-- head (P:sweep). Each check is one PUBSUB call (~5k instructions).
P.SWEEP = 128
-- Hints are pushed only for events this close; a waiter looks again by
-- itself at least this often (its reader's heartbeat: HEARTBEAT_PRESENT in
-- allocator/_core/liveness.py), so a later event is met then, at no cost to
-- the grant path.
P.HORIZON_MS = 2000
-- Expired leases and ended quarantines handled per pass on a hot path;
-- gc() loops until everything due is handled.
P.BATCH = 64
-- Counters of this run, reported by gc(); `more`: dispatch stopped at
-- DROP_LIMIT with dead tickets left at the head.
P.reclaimed, P.dropped, P.more = 0, 0, false
-- META, read by P:meta (`ld` false: not read yet); the hint last given
-- ({tag, key, msg}); the caller's own hint (P:hint); the time as hex
-- (P:now_stamp).
P.ld, P.nd, P.nh, P.hinted, P.self_hint, P.stamp = false, 0, 0, false, false, false
-- The length of the pool's event log (META `ev`), false while it is off.
P.ev = false
-- A released resource kept aside for the queue head (P:settle).
P.spare = false
-- Set by a reader's heartbeat: dispatch looks at the head even when
-- nothing is free, so that a dead head's grace starts at once.
P.look = false
-- Set once a run has swept the clients' presences (P:sweep); `due`: the
-- end of the grace of an absent head this run met (P:serve), which a
-- reader's heartbeat is told to look again at.
P.swept, P.due = false, false
-- The end of the grace of the absent client being granted (P:serve): its
-- grant's pick-up check comes then (P:grant, P:grant_many).
P.pick_at = false
-- The earliest presence check of a holder this run scheduled
-- (P:check_holder), which the head of the queue is told to look again for
-- (P:maintain keeps it in `nh`).
P.wake = 1e15

---------------------------------------------------------------------------
-- Checks: what a caller sends, and what the pool's keys hold
---------------------------------------------------------------------------

-- A user of a pool may run these scripts with any arguments, and may write
-- the pool's keys by hand: the ACL that lets the scripts write a key lets
-- its user write it too (lua/README.md, "Trust"). So each script checks
-- every argument it reads before its first write, against the bounds that
-- allocator/_core.py checks (no call the library makes is refused: where
-- the Python counts characters, so do these; where it refuses what could
-- only spoil the caller's own records, these may let it through); a bad one
-- gets the error reply 'ALLOCATOR-ARG <op>: <argument> <why>', and nothing
-- is written. The hot scripts (acquire, release) first test the common
-- case in one cheap expression and call these only when it fails. Records
-- are checked as they are parsed: a damaged field that can be put right
-- safely is (in memory at once, saved by the next write of the record,
-- counted by gc); what cannot gets 'ALLOCATOR-CORRUPT <key>: <what>', never
-- a raw Lua error, and never between two writes that must go together.
-- Bounds are literals, not fields of P (a field is made on every call):
-- 315360000000 ms is ten years (MAX_SECONDS in _core.py).

-- The reply to a bad argument: its name, why, and what came (shortened,
-- with control characters masked, so the reply stays one line).
function P:bad_arg(op, name, why, v)
  local got = 'nothing'
  if v then
    got = "'" .. self:shown(v) .. "'" .. (#v > 60 and '...' or '')
  end
  return redis.error_reply('ALLOCATOR-ARG ' .. op .. ': ' .. name .. ' ' .. why .. ', got ' .. got)
end

-- One argument: nil if it is good, else the error reply. `kind`:
-- 'int'   an integer from a to b, in the digits Python writes (no sign,
--         no leading zero, no exponent): several are stored as sent and
--         read back by int(), and '0' is compared as a string;
-- 'num'   an integer number from a to b in any form Lua reads (an argument
--         only ever used as a number: alive_ms);
-- 'flag'  '0' or '1';
-- 'text'  1 to a characters (Python counts characters: a text longer than
--         a bytes is counted in UTF-8 characters), none of the characters
--         in b ('|' in ids written into records and messages whose fields
--         '|' separates; '.' in a request's lease id, to which acquire_many
--         appends `.<i>`);
-- 'name'  a resource name: text of 1 to 1024 characters, UTF-8 (names go
--         back to Python, which decodes them), no control character (a
--         NUL would break the lex ranges of HELD and RLOG, `<name>\0...`;
--         Python refuses every control character).
function P:arg(op, name, v, kind, a, b)
  local why
  if kind == 'int' or kind == 'num' then
    local n = v and (kind == 'num' or v == '0' or string.find(v, '^[1-9]%d*$')) and tonumber(v)
    if n and n >= a and n <= b and n % 1 == 0 then
      return nil
    end
    why = 'must be an integer from ' .. a .. ' to ' .. b
  elseif kind == 'flag' then
    if v == '1' or v == '0' then
      return nil
    end
    why = "must be '0' or '1'"
  else
    local limit = kind == 'name' and 1024 or a
    if not v or v == '' or (#v > limit and (#v > 4 * limit or
        #v - select(2, string.gsub(v, '[\128-\191]', '')) > limit)) then
      why = 'must be 1 to ' .. limit .. ' characters long'
    elseif kind == 'name' and string.find(v, '%c') then
      why = 'must hold no control character'
    elseif kind == 'name' and not self.utf8(v) then
      why = 'must be UTF-8 text'
    end
    for i = 1, kind == 'text' and b and #b or 0 do
      if not why and string.find(v, string.sub(b, i, i), 1, true) then
        why = "must not hold '" .. string.sub(b, i, i) .. "'"
      end
    end
    if not why then
      return nil
    end
  end
  return self:bad_arg(op, name, why, v)
end

-- Is s UTF-8 as Python decodes it (no overlong form, no surrogate, nothing
-- past U+10FFFF)? ASCII is found at once; anything else byte by byte: a
-- lead byte, then its continuation bytes (the first of them in a narrower
-- range after E0, ED, F0 and F4).
function P.utf8(s)
  if not string.find(s, '[\128-\255]') then
    return true
  end
  local i = 1
  while i <= #s do
    local c, len, lo, hi = string.byte(s, i), 1, 128, 191
    if c > 244 or (c >= 128 and c < 194) then
      return false
    elseif c >= 240 then
      len, lo, hi = 4, c == 240 and 144 or 128, c == 244 and 143 or 191
    elseif c >= 224 then
      len, lo, hi = 3, c == 224 and 160 or 128, c == 237 and 159 or 191
    elseif c >= 194 then
      len = 2
    end
    for j = i + 1, i + len - 1 do
      local d = string.byte(s, j)
      if not d or d < (j == i + 1 and lo or 128) or d > (j == i + 1 and hi or 191) then
        return false
      end
    end
    i = i + len
  end
  return true
end

-- Text from the pool's keys for an error reply: shortened, control
-- characters (and, in what is not UTF-8, every byte past ASCII) masked.
function P:shown(s)
  s = string.sub(s, 1, 60)
  return (string.gsub(s, self.utf8(s) and '%c' or '[%c\128-\255]', '?'))
end

-- A stream id the server can read back: ms-seq, each part under 20 digits
-- (beyond 2^64 XRANGE refuses it, which would stop a script half-way).
function P.is_id(v)
  local ms, seq = string.match(v, '^(%d+)%-(%d+)$')
  return ms ~= nil and #ms < 20 and #seq < 20
end

-- A sorted-set score (-priority) as Python writes a number: finite, within
-- +-1e15, and in a form ZADD reads (no spaces, no hex, no inf or nan, no
-- underflow to 0: Redis refuses those mid-run).
function P.is_score(v)
  local n = string.find(v, '^[-+]?[%d.][%d.eE+-]*$') and tonumber(v)
  return n and n >= -1e15 and n <= 1e15 and (n ~= 0 or not string.find(v, '[1-9]'))
end

-- HINCRBY of a figure that a damaged field cannot stop: a field that holds
-- no integer (or would overflow) starts again from n. A figure is never a
-- decision, and a script must not die half-way for one. (redis.pcall costs
-- what redis.call does; P:count_wait, on every grant, has it inline.)
function P:add(key, field, n)
  local done = redis.pcall('HINCRBY', key, field, n)
  if type(done) == 'table' then
    self.mend_figure(done, key, field, n)
  end
end

-- After a HINCRBY (redis.pcall) that failed: a field that holds no integer,
-- or would overflow, starts again from n. Any other error (an ACL, a key of
-- another type) is no damage of a field: the command runs again under
-- redis.call, which raises it as it came. (Each pcall of the scripts treats
-- its failures so.)
function P.mend_figure(failed, key, field, n)
  local err = failed.err or ''
  if string.find(err, 'not an integer', 1, true) or string.find(err, 'overflow', 1, true) then
    return redis.call('HSET', key, field, n)
  end
  return redis.call('HINCRBY', key, field, n)
end

---------------------------------------------------------------------------
-- Resources
---------------------------------------------------------------------------

-- The time as the fixed-width hex that orders FREE (and a rate log): made
-- on first use, since only a run that frees or grants a resource needs it.
function P:now_stamp()
  local s = self.stamp
  if not s then
    s = string.format('%014x', self.now_us)
    self.stamp = s
  end
  return s
end

-- An integer (a count, a time in ms) as the decimal text that `..` and
-- redis.call would write, for less: they turn a number into text with a
-- printf of %.14g or %.17g (~5-7k instructions); a digit costs a
-- string.char, any other integer a printf of %d (~3k). nil for a number
-- that is no integer below 1e14 in size (only damage makes one): the
-- caller lets Lua or Redis convert it, as before.
function P.istr(n)
  if n % 1 ~= 0 or n <= -1e14 or n >= 1e14 then
    return nil
  end
  if n >= 0 and n <= 9 then
    return string.char(48 + n)
  end
  return string.format('%d', n)
end

-- cap|score|used|fence|state|until|stamp|rcount|rwin|rv
-- Numbers the grant path needs are converted; the rest stay strings. A
-- record read once is kept for the rest of the run (a release that hands
-- its resource straight on reads it once); res_save and retire keep the
-- kept copy right. `raw`: the record, read already (status, gc).
-- One match checks the shape, then the bounds a match cannot check; a
-- record that fails is damaged, and mended in memory (P:res_mend). The
-- score is checked where it is used: ZADD refuses a damaged one (P:place);
-- status and gc check it. `stuck`: the fence cannot grow. Tokens are kept
-- below 2^53, the integers a Lua number (a double) holds exactly: `fence +
-- 1` beyond that would repeat a token, and no token of the server clock in
-- us gets there before the year 2255. A resource whose fence has got there
-- (only damage can) is never granted again: out of FREE for good, reported
-- by status and gc (ALLOCATOR-CORRUPT).
function P:res_load(name, raw)
  local r = self.records[name]
  if r ~= nil then
    return r or nil
  end
  raw = raw or redis.call('HGET', self.RES, name)
  if not raw then
    self.records[name] = false
    return nil
  end
  local cap, score, used, fence, state, untl, stamp, rc, rw, rv = raw:match(
    '^(%d+)|([^|]+)|(%d+)|(%d+)|([aqtd])|(%d+)|(%x*)|(%d+)|(%d+)|(%d+)$')
  local n = cap and #cap <= 10 and tonumber(cap)
  if not n or n < 1 or n > 2147483648 or (#stamp ~= 0 and #stamp ~= 14) or
      (#rc > 1 and rc:byte(1) == 48) then
    r = self:res_mend(name, raw)
  else
    r = {
      cap = n, score = score, used = tonumber(used), fence = fence, state = state,
      untl = untl, stamp = stamp, rc = rc, rw = rw, rv = rv, cs = cap,
    }
    if #fence > 15 and (#fence > 16 or fence >= '9007199254740992') then
      r.stuck = true
    end
  end
  self.records[name] = r
  return r
end

-- A damaged record, read field by field: each wrong field takes a default
-- that can grant no more than the true record would. Capacity 1; priority
-- 0; the lease count from the index of live leases; the state and end of a
-- quarantine or throttle from PARK (else active); the stamp if it looks
-- like one, else none (placed anew by its next write: a member of FREE left
-- behind is met as a stale one, P:choose); no rate limit (unless count and
-- window read right); `rv` as it was if it reads right, else the fence, so
-- that no lease from before the damage counts again (their holders see them
-- lost). The fence has no safe default: one that is not a token is kept as
-- it is, and the resource is stuck. `bad`: a writer that saves it saves the
-- mended record; gc counts it. Reads only, so a read-only script may mend.
function P:res_mend(name, raw)
  local f = {}
  for part in string.gmatch(raw .. '|', '([^|]*)|') do
    f[#f + 1] = part
  end
  local function int(v, most)
    return v and #v <= most and string.find(v, '^%d+$') and v
  end
  local fence = int(f[4], 16)
  local r = {
    cap = tonumber(int(f[1], 10) or 1), score = f[2] and self.is_score(f[2]) and f[2] or '0',
    used = redis.call('ZLEXCOUNT', self.HELD, '[' .. name .. '\0', '(' .. name .. '\1'),
    fence = fence or f[4] or '', state = 'a', untl = '0', stamp = '', rc = '0', rw = '0',
    rv = fence or '0', stuck = not fence or fence >= '9007199254740992' and #fence == 16,
    bad = true,
  }
  if r.cap < 1 or r.cap > 2147483648 then
    r.cap = 1
  end
  local rv = int(f[10], 16)
  if fence and rv and (#rv < #fence or (#rv == #fence and rv <= fence)) then
    r.rv = rv
  end
  if f[7] and #f[7] == 14 and string.find(f[7], '^%x+$') then
    r.stamp = f[7]
  end
  local parked = redis.call('ZSCORE', self.PARK, name)
  if f[5] == 'd' then
    r.state = 'd'
  elseif parked and f[5] ~= 'a' then
    r.state, r.untl = f[5] == 't' and 't' or 'q', int(parked, 15) or tostring(self.now)
  end
  local rc, rw = int(f[8], 7), int(f[9], 15)
  if rc and rw and (rc == '0' or string.byte(rc, 1) ~= 48) and tonumber(rc) <= 1000000 then
    r.rc, r.rw = rc, rw
  end
  return r
end

-- A member of FREE that names no grantable resource leaves FREE; if it was
-- the resource's own entry, the record forgets it too (it is placed anew
-- once it can be granted again).
function P:unfree(member, name, r)
  redis.call('ZREM', self.FREE, member)
  if r and r.stamp ~= '' and r.stamp .. name == member then
    r.stamp = ''
    self:res_save(name, r)
  end
end

-- `fence` is written back as it was loaded unless a grant changed it (then
-- it is an exact string already); so is the capacity (`cs`, its text as
-- loaded: whoever changes `cap` clears it); `used` goes through P.istr;
-- numbers set by other paths go through Lua's conversion, which is exact
-- for their sizes (< 14 digits).
function P:res_save(name, r)
  self.records[name] = r
  redis.call('HSET', self.RES, name, (r.cs or r.cap) .. '|' .. r.score .. '|' ..
    (self.istr(r.used) or r.used) .. '|' .. r.fence .. '|' .. r.state .. '|' .. r.untl .. '|' ..
    r.stamp .. '|' .. r.rc .. '|' .. r.rw .. '|' .. r.rv)
end

-- The invariant of FREE: a resource is in it iff it is active, has a free
-- slot, and its fence can grow. `restamp` sends a resource that stays free
-- to the back of its priority class, because it was just used (or just
-- came back).
function P:place(name, r, restamp)
  local want = r.state == 'a' and r.used < r.cap and not r.stuck
  if r.stamp ~= '' and (restamp or not want) then
    if self.spare == name then
      -- Kept aside (P:settle), never added: granted now.
      self.spare = false
    else
      redis.call('ZREM', self.FREE, r.stamp .. name)
    end
    r.stamp = ''
  end
  if want and r.stamp == '' then
    r.stamp = self:now_stamp()
    local done = redis.pcall('ZADD', self.FREE, r.score, r.stamp .. name)
    if done ~= 1 and done ~= 0 then -- (an error: a table, not the count)
      if string.find(done.err or '', 'float', 1, true) then
        -- A damaged score, which ZADD refuses: priority 0, as P:res_mend
        -- has it (the caller saves the record).
        r.score, r.bad = '0', true
      end
      redis.call('ZADD', self.FREE, r.score, r.stamp .. name)
    end
  end
end

-- Every entry of EXP, PARK and PICK is written here, so that META's `nd`
-- stays a lower bound on the earliest time in any of them (maintenance is
-- skipped while nothing can be due), and `nh` one on the earliest lease
-- deadline or end of a quarantine or throttle: the events worth waking a
-- waiter for. (A pick-up check almost never frees anything, and a reader's
-- heartbeat meets it within a second.)
-- `at`: a number; `text`: the same as P.istr writes it, where the caller
-- made it already. `wakes`: a PICK entry worth waking a waiter for (a
-- holder's presence check, P:check_holder), which `nh` then covers too.
function P:schedule(key, at, member, text, wakes)
  text = text or self.istr(at) or at
  redis.call('ZADD', key, text, member)
  self:meta()
  if at < self.nd then
    self.nd = at
    redis.call('HSET', self.META, 'nd', text)
  end
  if wakes then
    self.wake = math.min(self.wake, at)
  elseif key == self.PICK then
    return
  end
  if at < self.nh then
    self.nh = at
    redis.call('HSET', self.META, 'nh', text)
  end
end

-- Out of rotation until `untl` (ms): quarantine ('q') or rate throttle ('t').
-- Whoever runs a script after that time brings it back (unpark).
function P:park(name, r, state, untl)
  r.state, r.untl = state, untl
  self:schedule(self.PARK, untl, name)
end

-- The resource leaves the pool. Its last token is kept in GONE, so that a
-- re-added resource continues its sequence; leases still on it become void.
function P:retire(name, r)
  if r.stamp ~= '' then
    redis.call('ZREM', self.FREE, r.stamp .. name)
  end
  redis.call('ZREM', self.PARK, name)
  redis.call('HDEL', self.RES, name)
  self.records[name] = false
  redis.call('HSET', self.GONE, name, r.fence)
  -- Leases still on it are void: they leave the index of live leases. Its
  -- rate log goes too (also one left from a rate dropped earlier), so that
  -- a re-added resource starts with a full budget.
  self:forget(name)
end

-- Clear a resource's entries in the lease index and the rate log (O(log n)
-- plus what is removed).
function P:forget(name)
  local lo, hi = '[' .. name .. '\0', '(' .. name .. '\1'
  redis.call('ZREMRANGEBYLEX', self.HELD, lo, hi)
  redis.call('ZREMRANGEBYLEX', self.RLOG, lo, hi)
end

-- After a lease of r ended: a draining resource leaves with its last lease,
-- any other goes back into rotation if it has a free slot now.
-- `spare` (release, when tickets wait): a resource that only now has a free
-- slot, and would enter FREE, is instead kept aside for the dispatch that
-- follows in the same run (P.spare): if nothing else is free, the queue
-- head is handed it straight away, without the ZADD to FREE, its ZREM at
-- the grant and a save of the record in between; otherwise, or if nobody
-- takes it, it enters FREE then (P:unspare), exactly as here. Its stamp is
-- set as P:place would, so that everything in between (P:choose, a
-- binding) sees it as free. Only with a score ZADD reads (P.is_score): a
-- damaged one is left to P:place, which mends it.
function P:settle(name, r, spare)
  if r.state == 'd' and r.used <= 0 then
    self:retire(name, r)
    return
  end
  if spare and r.stamp == '' and r.state == 'a' and r.used < r.cap and not r.stuck and
      self.is_score(r.score) then
    r.stamp = self:now_stamp()
    self.records[name] = r
    self.spare = name
    return
  end
  self:place(name, r, false)
  self:res_save(name, r)
end

-- The resource kept aside by P:settle enters FREE, and its record is saved.
function P:unspare()
  local name = self.spare
  local r = self.records[name]
  self.spare, r.stamp = false, ''
  self:place(name, r, false)
  self:res_save(name, r)
end

-- The pool's counters (STATS), kept by the scripts that change what they
-- count, so every process sees the same figures. Only a count above zero
-- costs a call.
function P:note(field, n)
  if n > 0 then
    self:add(self.STATS, field, n)
  end
end

-- A grant's wait, from the ticket's entry into the queue (its stream id is
-- the server time in ms) to now, into the histogram in STATS: field `w<i>`
-- counts the grants whose wait was at most the i-th bound (ms: 5 10 25 50
-- 100 250 500 1000 2500 5000 10000 30000 60000 300000) and more than the
-- one before, `w0` those beyond the last; `ws` is the sum of the waits in ms
-- (the grants are the sum of the buckets). Kept in step with WAIT_BOUNDS in
-- allocator/_core.py. The bounds are literals in a comparison chain, not a
-- table: a table would be built on every run of every script. A wait of 0
-- ms (the uncontended grant) adds nothing to the sum: one HINCRBY.
function P:count_wait(ticket)
  local w = self.now - tonumber(string.match(ticket, '^(%d+)'))
  local f = 'w0'
  if w <= 5 then f = 'w1'
  elseif w <= 10 then f = 'w2'
  elseif w <= 25 then f = 'w3'
  elseif w <= 50 then f = 'w4'
  elseif w <= 100 then f = 'w5'
  elseif w <= 250 then f = 'w6'
  elseif w <= 500 then f = 'w7'
  elseif w <= 1000 then f = 'w8'
  elseif w <= 2500 then f = 'w9'
  elseif w <= 5000 then f = 'w10'
  elseif w <= 10000 then f = 'w11'
  elseif w <= 30000 then f = 'w12'
  elseif w <= 60000 then f = 'w13'
  elseif w <= 300000 then f = 'w14'
  end
  -- (P.add, inline: this is every grant's path.)
  local done = redis.pcall('HINCRBY', self.STATS, f, '1')
  if type(done) == 'table' then
    self.mend_figure(done, self.STATS, f, '1')
  end
  if w > 0 then
    local ws = self.istr(w) or w
    done = redis.pcall('HINCRBY', self.STATS, 'ws', ws)
    if type(done) == 'table' then
      self.mend_figure(done, self.STATS, 'ws', ws)
    end
  end
end

-- Rate limit, an exact sliding window on the server clock: a grant at time t
-- is allowed iff fewer than rcount grants happened in (t - rwin, t]. The log
-- of a resource is the lex range [name\0, name\1) of RLOG (names are
-- printable, so \0 and \1 never occur in them); each member ends with the
-- grant time in us, then the token, which keeps members unique.
-- Called after each grant and when a throttle ends: if the budget is spent,
-- park the resource until the oldest grant in the window leaves it.
function P:throttle_if_spent(name, r)
  local lo, hi = '[' .. name .. '\0', '(' .. name .. '\1'
  local win = tonumber(r.rw) * 1000
  redis.call('ZREMRANGEBYLEX', self.RLOG, lo,
    '(' .. name .. '\0' .. string.format('%014x', self.now_us - win + 1))
  if redis.call('ZLEXCOUNT', self.RLOG, lo, hi) < tonumber(r.rc) then
    return
  end
  local oldest = redis.call('ZRANGEBYLEX', self.RLOG, lo, hi, 'LIMIT', '0', '1')[1]
  local at = tonumber(string.sub(oldest, #name + 2, #name + 15), 16)
  if not at or at > self.now_us then
    -- No grant time the scripts wrote (an entry added by hand; or one of
    -- a clock that ran ahead before a failover): out of the log, and look
    -- again. Each round removes one entry, so this ends.
    redis.call('ZREM', self.RLOG, oldest)
    return self:throttle_if_spent(name, r)
  end
  self:park(name, r, 't', math.ceil((at + win) / 1000))
end

---------------------------------------------------------------------------
-- Leases
---------------------------------------------------------------------------

-- L|ticket|token|granted_us|deadline_ms|ttl_ms|cid|pushed|resource
-- `pushed` is 1 if the grant went to the waiter's signal list (0: handed
-- over in a script reply); such a grant is *unclaimed* while its lease id is
-- in PICK (see P:claim).
-- Returns the lease (or nil) and the raw record of a waiting one (W|ticket).
-- All fields stay strings but the deadline. A record that is neither, as
-- the scripts write them, is damaged: nil, nil and the raw record. Those it
-- meets on the way (maintenance, dispatch, take-back) a script leaves for
-- gc, which removes them; a script asked about one by its owner replies
-- ALLOCATOR-CORRUPT (P.corrupt_lease).
function P:lease_load(lid)
  local raw = redis.call('HGET', self.RECS, lid)
  if not raw then
    return nil, nil
  end
  if string.byte(raw, 1) ~= 76 then -- 'L'
    if string.byte(raw, 1) == 87 and self.is_id(string.sub(raw, 3)) then -- 'W'
      return nil, raw
    end
    return nil, nil, raw
  end
  local ticket, token, granted, deadline, ttl, cid, pickup, res = raw:match(
    '^L|(%d+%-%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]+)|([01])|(.+)$')
  if not ticket or (#ticket > 20 and not self.is_id(ticket)) or #token > 19 then
    return nil, nil, raw
  end
  return {
    ticket = ticket, token = token, granted = granted, deadline = tonumber(deadline),
    ttl = ttl, cid = cid, pickup = pickup, res = res,
  }, raw
end

-- The reply to a caller whose own record (its lease id's) is damaged.
function P:corrupt_lease(lid)
  return redis.error_reply('ALLOCATOR-CORRUPT ' .. self.RECS .. ': the record of lease ' ..
    self:shown(lid) .. ' is malformed (gc removes it)')
end

-- `dl`: the deadline as P.istr writes it (nil: `..` converts it).
function P:lease_save(lid, L, dl)
  redis.call('HSET', self.RECS, lid, 'L|' .. L.ticket .. '|' .. L.token .. '|' .. L.granted ..
    '|' .. (dl or L.deadline) .. '|' .. L.ttl .. '|' .. L.cid .. '|' .. L.pickup .. '|' .. L.res)
end

function P.lease_reply(L)
  return {'granted', L.ticket, L.token, L.granted, L.deadline, L.ttl, L.res}
end

-- The grant message is built from fields that never change, so that a later
-- script can find it in the list again (LPOS) or take it out (LREM). It goes
-- to the signal list of the waiter's client, SIG .. cid, whose reader routes
-- it to the waiter by lease id.
function P.grant_msg(lid, L)
  return 'g|' .. lid .. '|' .. L.ticket .. '|' .. L.token .. '|' .. L.granted .. '|' .. L.ttl ..
    '|' .. L.res
end

-- A pushed grant is *claimed* once its owner has it: its client's reader
-- acknowledged it (a plain ZREM of the lease id from PICK, sent with the
-- reader's next read), it was handed over in a script reply (poll, a retried
-- acquire: this function), or it was renewed. A reader that pops a grant and
-- finds no waiter for it releases it only while it is unclaimed (release.lua,
-- `unclaimed`), so a late or repeated message never releases a lease its
-- owner holds. Here: take back the pushed message if nobody popped it yet.
-- `key` is the signal list it was pushed to.
function P:claim(lid, L, key)
  if L.pickup == '1' and redis.call('ZREM', self.PICK, lid) == 1 then
    redis.call('LREM', key, '1', self.grant_msg(lid, L))
  end
end

function P:unclaimed(lid, L)
  return L.pickup == '1' and redis.call('ZSCORE', self.PICK, lid) ~= false
end

-- A lease counts (is one of its resource's `used`) unless the resource left
-- the pool or was removed and added again since the grant (token <= rv).
function P.counted(L, r)
  return r ~= nil and (r.rv == '0' or tonumber(L.token) > tonumber(r.rv))
end

-- End a lease record: release, expiry, revocation, take-back, or a cancel
-- that raced a grant. The ticket is acked and deleted, so the stream only
-- holds live tickets; a grant message nobody took is taken off its list, so
-- no stray message is left. Returns the resource record with `used` lowered
-- (not yet saved, so the caller may park it first), or nil if the lease no
-- longer counted.
function P:end_lease(lid, L)
  redis.call('HDEL', self.RECS, lid)
  redis.call('ZREM', self.EXP, lid)
  self:claim(lid, L, self.SIG .. L.cid)
  redis.call('XACK', self.Q, 'g', L.ticket)
  redis.call('XDEL', self.Q, L.ticket)
  redis.call('ZREM', self.HELD, L.res .. '\0' .. lid)
  local r = self:res_load(L.res)
  if self.counted(L, r) then
    r.used = r.used - 1
    return r
  end
  return nil
end

function P:end_and_settle(lid, L)
  local r = self:end_lease(lid, L)
  if r then
    self:settle(L.res, r)
  end
end

---------------------------------------------------------------------------
-- Maintenance: every script starts by handling what came due.
---------------------------------------------------------------------------

-- Pushed grants not yet acknowledged by their client's reader, due for a
-- check. While the client is alive, the grant stays its own: it goes back
-- on the signal list (at the tail) in case a lost reply took it off, and is
-- checked again later; a live waiter never loses a grant to a slow reader.
-- Once the client's liveness has run out (it is gone, or stalled past the
-- liveness window), the grant is taken back and passed on, and the client,
-- should it come back, finds a notice `x|<lease id>` that makes the waiter
-- look again at once.
-- Then leases past their deadline (EXP holds deadlines only).
function P:reclaim(limit)
  local before = self.reclaimed
  local picks = redis.call('ZRANGEBYSCORE', self.PICK, '-inf', self.now, 'LIMIT', '0', limit)
  for _, lid in ipairs(picks) do
    local L = string.sub(lid, 1, 2) ~= 'c|' and self:lease_load(lid)
    if L == false then
      self:check_holder(lid)
    elseif not L or L.pickup ~= '1' then
      redis.call('ZREM', self.PICK, lid)
    else
      local live, gone_at = self:alive(L.cid)
      if gone_at then
        -- Absent within its grace: look again when the grace ends.
        self:schedule(self.PICK, gone_at, lid)
      elseif live then
        local key, msg = self.SIG .. L.cid, self.grant_msg(lid, L)
        redis.call('LREM', key, '1', msg)
        redis.call('RPUSH', key, msg)
        self:schedule(self.PICK, self.now + self.PICKUP_MS, lid)
      else
        self:take_back(lid, L)
      end
    end
  end
  local due = redis.call('ZRANGEBYSCORE', self.EXP, '-inf', self.now, 'LIMIT', '0', limit)
  for _, lid in ipairs(due) do
    local L = self:lease_load(lid)
    if not L then
      redis.call('ZREM', self.EXP, lid)
    elseif L.deadline <= self.now or self:holder_gone(lid, L) then
      self:end_and_settle(lid, L)
      self:tell_end(lid, L.cid)
      self.reclaimed = self.reclaimed + 1
      self:event(L.deadline <= self.now and 'expire' or 'reclaim', L.res, L.token, L.cid)
    end
  end
  self:note('reclaimed', self.reclaimed - before)
  return math.max(#picks, #due)
end

-- The presence check of a lease that ends when its holder is gone (a PICK
-- entry `c|<lease id>`, every CHECK_MS; it goes lazily, at its next time,
-- once the lease ended). The check only sees; the ending is by the lease's
-- EXP entry, brought forward to the end of the holder's grace, so that
-- the head of the queue is told to look again then (P:hint), and checked
-- again there (P:holder_gone). The presence alone decides: a holder that
-- does not wait keeps no liveness mark. Where nobody can tell, the checks
-- stop and the lease ends at its deadline.
function P:check_holder(entry)
  local lid = string.sub(entry, 3)
  local L = self:lease_load(lid)
  local at = L and self:gone_at(L.cid)
  if not L or at == false then
    redis.call('ZREM', self.PICK, entry)
    return
  end
  if at and at < L.deadline then
    self:schedule(self.EXP, at, lid)
  end
  -- The head of the queue looks again then (`nh`), so that a holder's
  -- death is found within a check, not a heartbeat.
  self:schedule(self.PICK, self.now + self.CHECK_MS, entry, nil, true)
end

-- A lease whose EXP entry came due before its deadline: the end of its
-- holder's grace (check_holder). True if the holder is gone (the lease
-- ends); else its entry goes back to its deadline, or to the grace's end
-- if that moved.
function P:holder_gone(lid, L)
  local at = self:gone_at(L.cid)
  if at and at <= self.now then
    return true
  end
  self:schedule(self.EXP, (at and at < L.deadline) and at or L.deadline, lid)
  return false
end

-- Take back a pushed grant that its client never acknowledged, its
-- liveness having run out; the client, should it come back, finds a notice
-- `x|<lease id>` that makes the waiter look again at once.
-- A grant of acquire_many is taken back whole: every other lease of the
-- same request that is still unacknowledged goes with it, in this run
-- (the pick-up checks of its leases are due together, but a batch could
-- part them). They sit in consecutive stream entries (added in one run;
-- entries are only ever appended), whose lease ids are the request's id
-- or `<id>.<i>`: the walk goes both ways from the ticket while the
-- entries belong to the request. For a single lease it costs two reads.
function P:take_back(lid, L)
  local base = string.match(lid, '^[^.]*')
  self:take_one(lid, L)
  for _, cmd in ipairs({{'XRANGE', '+'}, {'XREVRANGE', '-'}}) do
    local from = L.ticket
    while true do
      local e = redis.call(cmd[1], self.Q, '(' .. from, cmd[2], 'COUNT', 1)[1]
      local t = e and self.ticket_of(e)
      if not t or not t.l or string.match(t.l, '^[^.]*') ~= base then
        break
      end
      from = e[1]
      local S = self:lease_load(t.l)
      if S and S.ticket == e[1] and self:unclaimed(t.l, S) then
        self:take_one(t.l, S)
      end
    end
  end
end

function P:take_one(lid, L)
  self:end_and_settle(lid, L)
  self.reclaimed = self.reclaimed + 1
  self:event('reclaim', L.res, L.token, L.cid)
  -- A client gone by its presence (absent for a whole grace: its process
  -- died) reads nothing any more: its signal list goes (the grant just
  -- taken back, hints), as gc would delete it with its mark. Otherwise the
  -- notice, only while its liveness mark is still there: gc deletes the
  -- list together with the mark, and must not find it made again after.
  local at = self:gone_at(L.cid)
  if at and at <= self.now then
    redis.call('DEL', self.SIG .. L.cid)
  elseif redis.call('ZSCORE', self.ALIVE, L.cid) then
    redis.call('RPUSH', self.SIG .. L.cid, 'x|' .. lid)
  end
end

-- Quarantines and rate throttles that ended: back into rotation, unless the
-- rate budget is still spent (then parked again until it frees).
function P:unpark(limit)
  local due = redis.call('ZRANGEBYSCORE', self.PARK, '-inf', self.now, 'LIMIT', '0', limit)
  for _, name in ipairs(due) do
    redis.call('ZREM', self.PARK, name)
    local r = self:res_load(name)
    if r and (r.state == 'q' or r.state == 't') then
      self:unpark_one(name, r)
    end
  end
  return #due
end

-- A quarantine or throttle of r ended (its PARK entry is gone): back into
-- rotation, or throttled again at once if its rate budget is spent.
function P:unpark_one(name, r)
  r.state, r.untl = 'a', '0'
  if r.rc ~= '0' then
    self:throttle_if_spent(name, r)
  end
  self:place(name, r, true)
  self:res_save(name, r)
end

-- Handle what is due, if anything can be; then raise `nd` and `nh` to the
-- earliest times still scheduled (they stay in the past if a batch left
-- some due: the next run goes on).
function P:maintain(limit)
  self:meta()
  if self.nd > self.now then
    return 0, 0
  end
  limit = limit or self.BATCH
  local reclaimed, unparked = self:reclaim(limit), self:unpark(limit)
  local nh = math.min(self:first(self.EXP), self:first(self.PARK), self.wake)
  self.nh, self.nd = nh, math.min(nh, self:first(self.PICK))
  -- A pool that does not exist (deleted, or never made) stays so: a renew
  -- or release of a lease of a deleted pool must not make a key.
  if self.nd < 1e15 or redis.call('EXISTS', self.META) == 1 then
    redis.call('HSET', self.META, 'nd', self.nd, 'nh', self.nh)
  end
  return reclaimed, unparked
end

---------------------------------------------------------------------------
-- The queue
---------------------------------------------------------------------------

-- The pool's bookkeeping in META, read once per run: the last ticket
-- delivered (granted) in queue order, the lower bounds `nd` and `nh` (see
-- P:schedule), and the hint last pushed to a queue head ({tag, key, msg}).
-- A damaged field is read so that nothing is lost: `nd` or `nh` that is no
-- time as 0 (maintenance runs, and writes them right); a hint without its
-- list (or a list that is no signal list of the pool) as none; `ld` that is
-- no stream id is met where it is used (P:peek).
function P:meta()
  if not self.ld then
    -- (The hint first: the reply is kept as `hinted`, {tag, key, msg}.)
    local m = redis.call('HMGET', self.META, 'hint', 'hintkey', 'hintmsg', 'ld', 'nd', 'nh', 'ev')
    self.ld = m[4] or '0-0'
    local nd, nh = tonumber(m[5] or 0), tonumber(m[6] or 0)
    self.nd = nd and nd <= 1e15 and nd or 0
    self.nh = nh and nh <= 1e15 and nh or 0
    if m[7] then
      -- (Set only when on: a field of P costs every run that sets it.)
      self.ev = string.find(m[7], '^[1-9]%d?%d?%d?%d?%d?%d?%d?$') and m[7] or false
    end
    if m[1] and not (m[2] and m[3] and string.sub(m[2], 1, #self.SIG) == self.SIG) then
      m[1] = false
    end
    self.hinted = m
  end
end

-- The pool's event log (KEYS[16], a stream), where its operator switched it
-- on (META `ev`: about how many entries it keeps, set_events.lua): one
-- entry per grant, release, expiry, reclaim, revocation, quarantine and
-- dropped waiter, with fields `kind`, `resource`, `token`, `client` (and
-- `owner` where the run has it at hand: a grant, a drop). The entry's id is
-- the server time. Never the lease id: it gives power over the lease, and
-- the log is read by whoever may read the pool. Off, it costs a test.
function P:event(kind, res, token, cid, owner)
  self:meta()
  if self.ev then
    -- KEYS[16], made from KEYS[15] (`<p>:stats`): a field of P for it would
    -- cost every run of every script, the log being off or not.
    local key = string.sub(self.STATS, 1, -6) .. 'events'
    if owner then
      redis.call('XADD', key, 'MAXLEN', '~', self.ev, '*', 'kind', kind,
        'resource', res, 'token', token, 'client', cid, 'owner', owner)
    else
      redis.call('XADD', key, 'MAXLEN', '~', self.ev, '*', 'kind', kind,
        'resource', res, 'token', token, 'client', cid)
    end
  end
end

-- Where the queue's granted part ends, when `ld` cannot be read: every
-- ticket up to `ld` was granted, and a granted ticket stays in the stream
-- (pending in the group) exactly as long as its lease: so the last pending
-- id splits the stream where `ld` did. Reads only; the next grant saves
-- `ld` (P:deliver), and gc at once.
function P:last_granted()
  local p = redis.pcall('XPENDING', self.Q, 'g')
  if p.err then
    -- No group (nor queue): nothing was ever granted. Any other error is
    -- raised as it came (see P.mend_figure).
    if string.find(p.err, 'NOGROUP', 1, true) then
      return '0-0'
    end
    p = redis.call('XPENDING', self.Q, 'g')
  end
  return p[3] or '0-0'
end

-- Tickets waiting: every ticket in the stream is waiting or leased, and
-- every lease has one EXP entry. Derived, so it cannot drift; two O(1) reads
-- are cheaper than looking at the queue head.
function P:waiting()
  return redis.call('XLEN', self.Q) - redis.call('ZCARD', self.EXP)
end

-- A stream entry as a table: id, and the fields l, c, t (and b, B).
function P.ticket_of(e)
  local t = {id = e[1]}
  local f = e[2]
  for i = 1, #f, 2 do
    t[f[i]] = f[i + 1]
  end
  return t
end

-- The queue head: the first ticket after the last one granted. An `ld`
-- that XRANGE refuses (damage) is read as P:last_granted has it. (pcall
-- costs what call does: the check is free while nothing is wrong.)
function P:peek()
  self:meta()
  local e = redis.pcall('XRANGE', self.Q, '(' .. self.ld, '+', 'COUNT', 1)
  if e.err then
    -- ('Invalid stream ID'; 'invalid start ID' for the greatest id.) Any
    -- other error is raised as it came (see P.mend_figure).
    if string.find(e.err, 'ID', 1, true) then
      self.ld = self:last_granted()
    end
    e = redis.call('XRANGE', self.Q, '(' .. self.ld, '+', 'COUNT', 1)
  end
  e = e[1]
  return e and self.ticket_of(e)
end

-- Deliver the head to the consumer group: from now on it is pending, and gc
-- finds it with XAUTOCLAIM. XCLAIM ... FORCE puts the ticket in the pending
-- list exactly as XREADGROUP would, at a sixth of the cost when called from
-- a script (callgrind, Redis 7.0: ~20k vs ~120k instructions); the order of
-- delivery is the queue order that META's `ld` tracks. A missing group
-- (deleted, or a new stream) is created again.
function P:deliver(id)
  local ok = redis.pcall('XCLAIM', self.Q, 'g', 'd', '0', id, 'FORCE', 'JUSTID')
  if ok.err then
    redis.call('XGROUP', 'CREATE', self.Q, 'g', '0', 'MKSTREAM')
    redis.call('XCLAIM', self.Q, 'g', 'd', '0', id, 'FORCE', 'JUSTID')
  end
  self.ld = id
  redis.call('HSET', self.META, 'ld', id)
end

-- The waiter `lid` stops being the hinted head (granted, dropped, left):
-- take back a hint it has not read yet.
function P:unhint(lid)
  self:meta()
  local h = self.hinted
  if h[1] and string.sub(h[1], 1, #lid + 1) == lid .. '@' then
    if h[3] ~= '' then
      redis.call('LREM', h[2], '1', h[3])
    end
    redis.call('HDEL', self.META, 'hint', 'hintkey', 'hintmsg')
    self.hinted = {false, false, false}
  end
end

-- Stream ids `ms-seq`: is a later than b?
function P.id_after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then
    return false
  end
  am, bm = tonumber(am), tonumber(bm)
  return am > bm or (am == bm and tonumber(as) > tonumber(bs))
end

-- The earliest score in a zset of times (1e15: none).
function P:first(key)
  return tonumber(redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2] or 1e15)
end

-- The head cannot be served now: tell it when to look again, so that it
-- wakes then instead of polling. The time is `nh`, the lower bound on the
-- next lease deadline or quarantine or throttle end (waking early costs one
-- poll, which sets it right). The
-- caller learns it from its reply; any other head is pushed a hint, once per
-- head and time, and only if the event is nearer than the heartbeat by which
-- it looks again anyway.
function P:hint(t, self_lid, at)
  local wake = at or self.nh
  if wake >= 1e15 then
    return
  end
  local delay = math.max(wake - self.now, 1)
  local mine = t.l == self_lid
  if mine then
    self.self_hint = delay
  end
  -- Only a hint within the horizon is recorded: a later one is never
  -- pushed, so there is nothing to guard against pushing twice (the caller
  -- has its own in its reply; should another run come within the horizon
  -- of the same time first, it pushes it once more, which costs the
  -- waiter nothing). Most queued heads wait on a lease deadline far away:
  -- they cost neither a record nor its removal at their grant.
  if delay > self.HORIZON_MS then
    return
  end
  local tag = t.l .. '@' .. wake
  local h = self.hinted
  if h[1] == tag then
    return
  end
  if h[1] and h[3] ~= '' then
    redis.call('LREM', h[2], '1', h[3])
  end
  -- The caller's reply carries its hint: record it (so no script pushes it
  -- again) without pushing anything.
  local key, msg = self.SIG .. t.c, ''
  if not mine then
    msg = 'h|' .. t.l .. '|' .. delay
    redis.call('RPUSH', key, msg)
  end
  redis.call('HSET', self.META, 'hint', tag, 'hintkey', key, 'hintmsg', msg)
  self.hinted = {tag, key, msg}
end

-- A client's presence, read only: 1 connected, 0 not, -1 nobody can tell
-- (a client without a presence, or a server that cannot count).
function P:presence_of(cid)
  if string.sub(cid, 1, 2) ~= 'p.' then
    return -1
  end
  local here = self:present(cid)
  return here == nil and -1 or (here and 1 or 0)
end

-- The head `t` waits for its absent client's grace to end at `at`: the
-- ticket behind it is told to look again then (the caller by its reply).
function P:hint_next(t, at, self_lid)
  local e = redis.call('XRANGE', self.Q, '(' .. t.id, '+', 'COUNT', 1)[1]
  if e then
    self:hint(self.ticket_of(e), self_lid, at)
  end
end

-- A waiting ticket whose client is gone (its liveness mark ran out) leaves
-- the queue; so does an entry that was never a waiter's (added or damaged
-- by hand: no record names it). Only a ticket that is not granted: a
-- granted one is a lease, which only ends through end_lease (it keeps
-- `used` right); then false, and nothing is changed.
function P:drop(t)
  local raw = t.l and redis.call('HGET', self.RECS, t.l)
  local mine = raw == 'W|' .. t.id
  if raw and not mine and string.sub(raw, 1, #t.id + 3) == 'L|' .. t.id .. '|' then
    return false
  end
  redis.call('XDEL', self.Q, t.id)
  if t.x == '1' then
    -- A place-holder entry of a multi request (see P:grant_many): it has
    -- no record and is no waiter of its own.
    self:extras(-1)
    return true
  end
  if mine then
    redis.call('HDEL', self.RECS, t.l)
  end
  if t.l then
    self:unhint(t.l)
  end
  self.dropped = self.dropped + 1
  self:note('dropped', 1)
  self:event('drop', '', '', t.c or '', t.o)
  return true
end

-- Can queue entry t be served: does it hold what a grant reads (a pool's
-- user may add entries by hand)? A lease id and a client id; a ttl (kept as
-- `tn` for the grant), and with a binding its ttl, numbers of ms in range;
-- a count from 1 to 1000. What a grant only copies (the ttl's digits, a
-- client id) can at worst spoil the record of the lease granted by it,
-- which the scripts then treat as damaged (P:lease_load): never the pool.
-- A place-holder needs only its lease id, client id and mark.
function P.ticket_ok(t)
  if not t.l or not t.c then
    return false
  elseif t.x then
    return t.x == '1'
  end
  -- (Each test is written so that NaN fails it.)
  local n = tonumber(t.t)
  if not (n and n >= 1 and n <= 315360000000) then
    return false
  end
  t.tn = n
  if t.b then
    n = tonumber(t.B)
    if not (n and n >= 1 and n <= 315360000000) then
      return false
    end
  end
  if t.n then
    n = tonumber(t.n)
    return n ~= nil and n >= 1 and n <= 1000 and n % 1 == 0
  end
  return true
end

-- Whether client `cid` lives: its liveness mark has not run out, and, if it
-- keeps a presence, it has not been absent for GRACE_MS. A client absent
-- within its grace lives, and the second value is when it will count as
-- gone (P:gone_at).
function P:alive(cid)
  local s = redis.call('ZSCORE', self.ALIVE, cid)
  if not s or tonumber(s) < self.now then
    return false
  end
  local at = self:gone_at(cid)
  if not at then
    return true
  elseif at > self.now then
    return true, at
  end
  return false
end

-- When client `cid` counts as gone by its presence alone: nil while it is
-- connected, false where nobody can tell (it keeps no presence, or the
-- server cannot count), else the end of its grace, GRACE_MS after the
-- first run that found it absent (RECS field `p|<cid>` holds since when;
-- it goes once the client is found again or runs a call of its own, or
-- with its mark in gc).
function P:gone_at(cid)
  if string.sub(cid, 1, 2) ~= 'p.' then
    return false
  end
  local here = self:present(cid)
  local field = 'p|' .. cid
  local since = redis.call('HGET', self.RECS, field)
  if here ~= false then
    if since then
      redis.call('HDEL', self.RECS, field)
    end
    if here == nil then
      return false
    end
    return nil
  end
  if not since then
    since = self.now
    redis.call('HSET', self.RECS, field, since)
  end
  self:sweep(since == self.now)
  return tonumber(since) + self.GRACE_MS
end

-- A client was found absent: check the presence of the next SWEEP clients
-- of ALIVE (by rank, from META's cursor `pc`) and start the grace of each
-- one that is absent too, so that the clients of a crowd that died
-- together are gone together, a grace after the first was found, however
-- many there are ahead of a live waiter. Once per run, bounded; a sweep
-- that did not reach the end of ALIVE leaves `pc`, and every run that
-- meets an absent client goes on from there (`fresh`: this run found a new
-- absence, which starts a sweep from the start if none is under way).
-- ALIVE holds the clients that wait (their liveness marks); a holder's
-- presence is checked by its leases' own checks (P:check_holder). An
-- absence marked here is ended like any other, by the client's return
-- (present.lua) or a run that finds it connected (P:gone_at).
function P:sweep(fresh)
  if self.swept then
    return
  end
  self.swept = true
  local pc = redis.call('HGET', self.META, 'pc')
  local from = tonumber(pc or '0') or 0
  if not pc and not fresh then
    return
  end
  local cids = redis.call('ZRANGE', self.ALIVE, from, from + self.SWEEP - 1)
  for _, cid in ipairs(cids) do
    if string.sub(cid, 1, 2) == 'p.' and self:present(cid) == false then
      redis.call('HSETNX', self.RECS, 'p|' .. cid, self.now)
    end
  end
  if #cids < self.SWEEP then
    if pc then
      redis.call('HDEL', self.META, 'pc')
    end
  else
    redis.call('HSET', self.META, 'pc', self.istr(from + self.SWEEP) or from + self.SWEEP)
  end
end

-- Is client `cid` connected right now: does a connection subscribe to its
-- presence channel? A process that dies has its sockets closed by its
-- kernel, and the server drops them at once; a stopped or stalled one keeps
-- them. Sharded channels (SSUBSCRIBE, counted with SHARDNUMSUB) where the
-- server has them (Redis >= 7, Valkey: they live in the pool's cluster
-- slot), plain ones on 6.2. nil where the server cannot tell (an ACL
-- without PUBSUB, a server without the command): the mark alone decides.
function P:present(cid)
  local channel = string.sub(self.SIG, 1, -3) .. 'p:' .. cid
  local verb = redis.REDIS_VERSION_NUM and 'SHARDNUMSUB' or 'NUMSUB'
  local reply = redis.pcall('PUBSUB', verb, channel)
  if type(reply) ~= 'table' or reply.err or not reply[2] then
    return nil
  end
  return tonumber(reply[2]) > 0
end

-- What client `cid` says of itself when it joins the pool (its first
-- acquire there): `info` (`<pid>|<version>|<host>`) with the time, in RECS
-- field `i|<cid>` (clients.lua shows it). Kept once; it goes with the
-- client's liveness mark (gc), which it starts if there is none, so that
-- a client that never waits leaves nothing behind.
function P:introduce(cid, info, alive)
  if redis.call('HSETNX', self.RECS, 'i|' .. cid, self.now .. '|' .. info) == 1 then
    redis.call('ZADD', self.ALIVE, 'NX', self.now + alive, cid)
  end
end

-- Tell the holder of lease `lid` that it ended (revoked, reclaimed, its
-- resource removed or its pool deleted by force): `e|<lease id>` on its
-- client's presence channel, which its presence connection already
-- listens to (allocator/_core/holding.py, `Holds.ended`), so that its
-- `lost()` turns true at once. SPUBLISH where P:present counts with
-- SHARDNUMSUB, PUBLISH on 6.2. Only for a client that keeps a presence;
-- a failure (an ACL without the channel) tells nobody and changes nothing.
function P:tell_end(lid, cid)
  if string.sub(cid, 1, 2) == 'p.' then
    redis.pcall(redis.REDIS_VERSION_NUM and 'SPUBLISH' or 'PUBLISH',
      string.sub(self.SIG, 1, -3) .. 'p:' .. cid, 'e|' .. lid)
  end
end

-- Which free resource the head gets; `best` is the first member of FREE.
-- With soft binding: the bound resource if it is free, before any other;
-- else the best free one, and the binding moves there only if there was
-- none (or it expired) or its resource left the pool.
-- Returns name, record, and what happened to the binding.
function P:choose(t, best)
  local binding = nil
  if t.b then
    binding = 'moved'
    local bound = redis.call('HGET', self.BIND, t.b)
    if bound and tonumber(redis.call('ZSCORE', self.BEXP, t.b) or 0) > self.now then
      local r = self:res_load(bound)
      if r and r.stamp ~= '' and r.state == 'a' and r.used < r.cap and not r.stuck then
        return bound, r, 'hit'
      end
      binding = r and 'miss' or 'moved'
    end
  end
  local name = string.sub(best, 15)
  local r = self:res_load(name)
  -- Can it be granted? FREE's invariant says so of its members, but a
  -- member may be stale (a damaged record, a write by hand). One that names
  -- a grantable resource under an older stamp is granted safely; it leaves
  -- FREE once it names one that is not.
  if r and r.state == 'a' and r.used < r.cap and not r.stuck then
    return name, r, binding
  end
  -- A stale member of FREE: it leaves FREE, nothing is granted by it, and
  -- the caller looks again.
  self:unfree(best, name, r)
  return nil
end

-- Grant the head a free resource. The ticket becomes pending in the group;
-- the token is the resource's next, floored on the server clock in us so
-- that tokens keep growing even after a restart that lost data. A waiter
-- other than the caller is told by a push to its signal list; that grant
-- must be popped within PICKUP_MS or it is taken back. nil (and nothing
-- granted) if `best` was a stale member of FREE.
function P:grant(t, best, self_lid)
  local name, r, binding = self:choose(t, best)
  if not name then
    return nil
  end
  self:deliver(t.id)
  self:unhint(t.l)
  -- The floor is the common case; a second grant in the same microsecond
  -- (capacity > 1) takes the next number.
  local token = self.now_s
  local fence = tonumber(r.fence)
  if fence >= self.now_us then
    token = string.format('%.0f', fence + 1)
    if tonumber(token) >= 9007199254740992 then
      -- The last token it can give (P:res_load): no more grants, from
      -- this run on.
      r.stuck = true
    end
  end
  r.fence = token
  r.used = r.used + 1
  if r.rc ~= '0' then
    redis.call('ZADD', self.RLOG, '0', name .. '\0' .. self:now_stamp() ..
      string.format('%014x', tonumber(token)))
    self:throttle_if_spent(name, r)
  end
  self:place(name, r, true)
  self:res_save(name, r)

  local deadline = self.now + (t.tn or tonumber(t.t))
  local dl = self.istr(deadline)
  local L = {
    ticket = t.id, token = token, granted = self.now_s, deadline = deadline, ttl = t.t,
    cid = t.c, pickup = '0', res = name,
  }
  redis.call('ZADD', self.HELD, '0', name .. '\0' .. t.l)
  self:count_wait(t.id)
  if t.l ~= self_lid then
    L.pickup = '1'
    redis.call('RPUSH', self.SIG .. t.c, self.grant_msg(t.l, L))
    self:schedule(self.PICK, self.pick_at or self.now + self.PICKUP_MS, t.l)
  end
  self:lease_save(t.l, L, dl)
  self:schedule(self.EXP, deadline, t.l, dl)
  self:event('grant', name, token, t.c, t.o)
  if t.e == '1' then
    self:schedule(self.PICK, self.now + self.CHECK_MS, 'c|' .. t.l, nil, true)
  end

  if binding then
    if binding == 'hit' then
      self:add(self.META, 'bhit', '1')
    else
      self:add(self.META, 'bmiss', '1')
      if binding == 'moved' then
        redis.call('HSET', self.BIND, t.b, name)
      end
    end
    redis.call('ZADD', self.BEXP, self.now + tonumber(t.B), t.b)
  end
  return L
end

-- Serve the queue in order while resources are free. Tickets of clients that
-- are gone are dropped on the way, up to DROP_LIMIT per run (then `more` is
-- set and the caller is told to look again at once). Stops at the first
-- live waiter that cannot be served, and tells it when to look again.
-- Returns the caller's lease if the caller (self_lid) was served; the
-- caller is never pushed to: its reply carries the grant. The caller is
-- always last in line, so serving it ends the loop.
-- `waits`: the caller has just found that tickets wait (P:waiting).
function P:dispatch(self_lid, waits)
  local L = self:serve(self_lid, waits)
  if self.spare then
    self:unspare()
  end
  return L
end

-- The loop of P:dispatch. A resource kept aside by P:settle (P.spare) is
-- the best free one while FREE is empty; once FREE holds anything (or a
-- request for several resources is at the head), it enters FREE first and
-- FREE decides, as it would have without being kept aside.
function P:serve(self_lid, waits)
  if not self_lid and not waits and self:waiting() <= 0 then
    return nil
  end
  self:meta()
  local drops = 0
  -- Clients found gone in this run: a crowd's tickets are dropped without
  -- asking again for each (a client has many waiters, one after another).
  local dead = {}
  while true do
    local best = redis.call('ZRANGE', self.FREE, '0', '0')[1]
    if self.spare then
      if best then
        self:unspare()
        best = redis.call('ZRANGE', self.FREE, '0', '0')[1]
      else
        best = self.records[self.spare].stamp .. self.spare
      end
    end
    -- Nobody can be served: only the head needs telling, and (unless it is
    -- the caller) only of an event nearer than its heartbeat.
    if not best and not self_lid and not self.look and self.nh > self.now + self.HORIZON_MS then
      return nil
    end
    local t = self:peek()
    if not t then
      return nil
    end
    -- The caller's own ticket was made of checked arguments; any other is
    -- checked before it is served (P.ticket_ok; one without a lease id is
    -- nobody's).
    local live, gone_at = true, nil
    if t.l ~= self_lid or not self_lid then
      live = self.ticket_ok(t) and not dead[t.c]
      if live then
        live, gone_at = self:alive(t.c)
        if not live then
          dead[t.c] = true
        end
      end
    end
    if not live then
      if drops >= self.DROP_LIMIT then
        self.more, self.self_hint = true, 0
        return nil
      end
      if not self:drop(t) then
        -- A granted ticket after `ld` (`ld` was damaged, or set back by
        -- hand): it was delivered, so the queue's head is after it.
        self.ld = t.id
        redis.call('HSET', self.META, 'ld', t.id)
      end
      drops = drops + 1
    elseif gone_at and not best then
      -- The head's client is absent, within its grace, and nothing is
      -- free: nobody passes it (it may be reconnecting); whoever is next
      -- looks again when the grace ends, when the head counts as gone if
      -- it is still absent.
      self:hint_next(t, gone_at, self_lid)
      self.due = gone_at
      return nil
    elseif t.x then
      -- A place-holder whose multi request left without it (a gc page
      -- boundary between the two): a leftover.
      redis.call('XDEL', self.Q, t.id)
      self:extras(-1)
    elseif not best then
      self:hint(t, self_lid)
      return nil
    elseif t.n then
      self.pick_at = gone_at
      -- A request for several resources. Head-of-line rule: it is served
      -- only when `n` resources are free at once, and while it waits at
      -- the head nobody behind it is served either (no backfilling), so a
      -- stream of single requests can never starve it. ZCARD of FREE is
      -- the number of distinct resources that can be granted now:
      -- quarantined, throttled (rate budget spent), draining and full ones
      -- are not in it (P:free_ok makes sure no stale member counts).
      local n = tonumber(t.n)
      if self.spare then
        self:unspare()
      end
      if redis.call('ZCARD', self.FREE) < n or not self:free_ok(n) then
        self:hint(t, self_lid)
        return nil
      end
      local got = self:grant_many(t, self_lid)
      if got and t.l == self_lid then
        return got
      end
    else
      -- An absent head (within its grace) is served all the same, in its
      -- turn: a client that is reconnecting finds its grant on its list,
      -- which its presence does not carry; the check of the grant comes
      -- when the grace ends (P:grant), and takes it back if the client is
      -- gone then. So a dead head holds up one resource for its grace, not
      -- the whole queue (a pool whose workers are killed and replaced again
      -- and again kept serving).
      self.pick_at = gone_at
      local L = self:grant(t, best, self_lid)
      if L and t.l == self_lid then
        return L
      end
    end
  end
end

-- Are the first n members of FREE n grantable resources? A stale member
-- met on the way leaves FREE (P:unfree), and the look starts again.
-- grant_many relies on it: once it has started, it must not meet one.
function P:free_ok(n)
  while true do
    local members = redis.call('ZRANGE', self.FREE, '0', n - 1)
    if #members < n then
      return false
    end
    local clean = true
    for _, m in ipairs(members) do
      local name = string.sub(m, 15)
      local r = self:res_load(name)
      -- (As P:choose checks, and the member must be the resource's own:
      -- two members of one resource are not two resources.)
      if not (r and r.stamp .. name == m and r.state == 'a' and r.used < r.cap and
          not r.stuck) then
        self:unfree(m, name, r)
        clean = false
      end
    end
    if clean then
      return true
    end
  end
end

---------------------------------------------------------------------------
-- Several resources at once (acquire_many)
---------------------------------------------------------------------------

-- A request for `n` resources is one place in the queue: its head entry
-- (fields l, c, t and n) and right behind it n - 1 place-holder entries
-- (fields l = `<lid>.<i>`, c, x = '1'), all added in one script run, so
-- nobody is ever between them. At the grant, entry i becomes the ticket of
-- lease i, so that every lease keeps exactly one pending stream entry and
-- one EXP entry (`XLEN q - ZCARD exp` stays the count of waiting entries,
-- and release, renew, reclaim and gc treat each lease as any other). META
-- `xw` counts the place-holders still waiting, so that status() counts a
-- waiting multi request once.
function P:extras(d)
  self:add(self.META, 'xw', d)
end

-- The lease id of resource i of the request `lid`.
function P.many_id(lid, i)
  if i == 1 then
    return lid
  end
  return lid .. '.' .. i
end

-- Grant the head request `t` its `n` resources, in this one run: each one
-- through P:grant, the single grant path, so that priorities,
-- least-recently-free order, rate limits and pushes apply per resource.
-- Resource i is the best free one not already chosen: only chosen ones
-- still free (capacity > 1) can come before it in FREE, so one ZRANGE of
-- one more member than those finds it (O(n x log N) for the whole grant
-- on a pool of exclusive resources). The caller (ZCARD FREE >= n) made
-- sure there are n.
-- Returns the leases as a list of {lease id, lease}, or nil if the
-- request's place-holders are missing (then the request is dropped: its
-- waiter, told 'gone' by its next look, queues again).
function P:grant_many(t, self_lid)
  local n = tonumber(t.n)
  local entries = {t}
  if n > 1 then
    local rest = redis.call('XRANGE', self.Q, '(' .. t.id, '+', 'COUNT', n - 1)
    for i, e in ipairs(rest) do
      local x = self.ticket_of(e)
      if x.l ~= self.many_id(t.l, i + 1) then
        break
      end
      entries[i + 1] = x
    end
  end
  if #entries < n then
    redis.call('XDEL', self.Q, t.id)
    redis.call('HDEL', self.RECS, t.l)
    self:unhint(t.l)
    return nil
  end
  local mine = t.l == self_lid
  -- `stay`: resources chosen so far that are still in FREE (capacity > 1
  -- with a slot left); only they can come before the best new one.
  local chosen, got, stay = {}, {}, 0
  for _, e in ipairs(entries) do
    local best = nil
    for _, member in ipairs(redis.call('ZRANGE', self.FREE, 0, stay)) do
      if not chosen[string.sub(member, 15)] then
        best = member
        break
      end
    end
    -- Lease i is the head ticket with its own entry and lease id; every
    -- other field of the head (ttl, client, and whatever a grant reads)
    -- is the same for all of them.
    local ti = {}
    for k, v in pairs(t) do
      ti[k] = v
    end
    ti.id, ti.l, ti.n = e.id, e.l, nil
    local L = self:grant(ti, best, mine and e.l or nil)
    chosen[L.res] = true
    got[#got + 1] = {e.l, L}
    if self.records[L.res].stamp ~= '' then
      stay = stay + 1
    end
  end
  if n > 1 then
    self:extras(1 - n)
  end
  return got
end

-- The leases of a granted request `lid` for `n` resources: all n as a list
-- of {lease id, lease}, or nil. A grant of which some leases already ended
-- (taken back while its client looked gone, expired before the waiter
-- looked) is ended whole: a requester holds all of its resources or none.
-- Also returns the raw record of the first lease id (W|ticket while waiting),
-- or, as third value, a damaged record of the request (nothing is changed).
function P:many_load(lid, n)
  local got, ids = {}, {}
  for i = 1, n do
    ids[i] = self.many_id(lid, i)
  end
  -- One read for all (a new request has none of them); each lease found is
  -- then read and parsed by lease_load.
  local raws = redis.call('HMGET', self.RECS, unpack(ids))
  local raw = raws[1] or nil
  if raw and string.byte(raw, 1) ~= 76 and not (string.byte(raw, 1) == 87 and
      self.is_id(string.sub(raw, 3))) then
    return nil, nil, raw
  end
  for i = 1, n do
    if raws[i] and string.byte(raws[i], 1) == 76 then -- 'L'
      local L, _, bad = self:lease_load(ids[i])
      if not L then
        return nil, nil, bad
      end
      got[#got + 1] = {ids[i], L}
    end
  end
  if #got == n then
    return got, raw
  end
  for _, g in ipairs(got) do
    self:end_and_settle(g[1], g[2])
  end
  if #got > 0 then
    raw = nil
  end
  return nil, raw
end

function P.many_reply(got)
  local out = {'granted_many'}
  for _, g in ipairs(got) do
    local L = g[2]
    for _, v in ipairs({L.ticket, L.token, L.granted, L.deadline, L.ttl, L.res}) do
      out[#out + 1] = v
    end
  end
  return out
end
