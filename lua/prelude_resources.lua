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
-- printf of %.14g or %.17g (~5-7k instructions); 0 and 1 (the counts of
-- most resources) cost a comparison, another digit a string.char (~1,500),
-- any other integer a printf of %d (~3k). nil for a number
-- that is no integer below 1e14 in size (only damage makes one): the
-- caller lets Lua or Redis convert it, as before.
function P.istr(n)
  if n == 0 then
    return '0'
  elseif n == 1 then
    return '1'
  elseif n % 1 ~= 0 or n <= -1e14 or n >= 1e14 then
    return nil
  elseif n >= 0 and n <= 9 then
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
  -- Written by an earlier call of this library (P:res_save): taken out,
  -- as P:lease_load takes a lease.
  local kept = self.RES_OF
  r = kept and kept[raw]
  if r then
    kept[raw], kept[1] = nil, kept[1] - 1
    self.records[name] = r
    return r
  end
  local cap, score, used, fence, state, untl, stamp, rc, rw, rv = raw:match(
    '^(%d+)|([^|]+)|(%d+)|(%d+)|([aqtd])|(%d+)|(%x*)|(%d+)|(%d+)|(%d+)$')
  -- (`+ 0`: digits the match checked, for a third of what tonumber costs.)
  local n = cap and #cap <= 10 and cap + 0
  if not n or n < 1 or n > 2147483648 or (#stamp ~= 0 and #stamp ~= 14) or
      (#rc > 1 and rc:byte(1) == 48) then
    r = self:res_mend(name, raw)
  else
    r = {
      cap = n, score = score, used = used + 0, fence = fence, state = state,
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
-- In the Functions library the text is kept with the record itself (RES_OF),
-- unless the record was mended: a mended one is read again as it reads. Not
-- a copy, which cost each save about 5,000 instructions (a table of 12
-- fields, and the collector's work on it). So every run changes a record
-- only before a save of it: each change below (P:grant, P:end_lease, P:park,
-- P:place, P:settle, and the scripts that set a field) is followed by
-- res_save in the same run, or by P:retire, which deletes the record. A
-- record is kept under one text at most, the last it was saved as (`kt`),
-- so that no two resources can be handed the same table.
function P:res_save(name, r)
  self.records[name] = r
  local text = (r.cs or r.cap) .. '|' .. r.score .. '|' .. (self.istr(r.used) or r.used) .. '|' ..
    r.fence .. '|' .. r.state .. '|' .. r.untl .. '|' .. r.stamp .. '|' .. r.rc .. '|' .. r.rw ..
    '|' .. r.rv
  redis.call('HSET', self.RES, name, text)
  local kept = self.RES_OF
  if kept and not r.bad then
    self.keep(kept, text, r, r.kt)
    r.kt = text
  end
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
    if self.none_free then
      self.none_free = false
    end
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
  if not self.nd then
    self:times()
  end
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
-- allocator/_core/replies.py. The bounds are literals in a comparison chain, not a
-- table: a table would be built on every run of every script. A wait of 0
-- ms adds nothing to the sum: one HINCRBY. `fresh`: the ticket was queued
-- in this run (the uncontended grant), so its wait is 0 without reading it.
function P:count_wait(ticket, fresh)
  local w = fresh and 0 or self.now - string.match(ticket, '^(%d+)')
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
