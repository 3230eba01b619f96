---------------------------------------------------------------------------
-- The queue
---------------------------------------------------------------------------

-- The pool's bookkeeping in META, read once per run: the length of the
-- event log, the hint, the order, and the lower bounds `nd` and `nh` (see
-- P:schedule). A damaged field is read so that nothing is lost: `nd` or
-- `nh` that is no time as 0 (maintenance runs, and writes them right).
-- Read once: a helper that needs META calls it only while `got_meta` is
-- false (a method call costs about 450 instructions, the test about 130).
-- Each field of an HMGET costs about 2,000 instructions (its lookup in the
-- hash, its place in the reply table): of the hint, only its tag is read
-- here, and its list and message where there is one (P:hints); and where a
-- run read `nd` and `nh` already (P:times), not those.
function P:meta()
  if not self.got_meta then
    local m
    if self.nd then
      m = redis.call('HMGET', self.META, 'ev', 'hint', 'ord')
    else
      m = redis.call('HMGET', self.META, 'ev', 'hint', 'ord', 'nd', 'nh')
      self:read_times(m[4], m[5])
    end
    self.got_meta = true
    if m[1] then
      -- (Set only when on: a field of P costs every run that sets it.)
      self.ev = string.find(m[1], '^[1-9]%d?%d?%d?%d?%d?%d?%d?$') and m[1] or false
    end
    if m[3] then
      -- (The tenant order, prelude_tenants.lua: `t`, `b` or `f`; set only
      -- where it is used. Anything else is fifo; an earlier version's
      -- `|<ticket>` after it is passed over.)
      local ord = string.match(m[3], '^([tbf])')
      self.ord = ord or false
    end
    if m[2] then
      self.hint_tag = m[2]
    end
  end
end

-- Of META, only `nd` and `nh`, for a run that may need nothing else (a
-- renew while nobody waits: about 7,000 instructions less than P:meta); a
-- later P:meta reads the rest. `nd` is false until read (0 is true in Lua).
function P:times()
  if not self.nd then
    local m = redis.call('HMGET', self.META, 'nd', 'nh')
    self:read_times(m[1], m[2])
  end
end

-- In the Functions library the number of each text is kept across calls
-- (TIME_OF): the bounds change only when maintenance runs or a run lowers
-- them, and a `tonumber` of a time costs about 2,000 instructions.
function P:read_times(nd, nh)
  local kept = self.TIME_OF
  if kept and nd and nh then
    local d, h = kept[nd], kept[nh]
    if d and h then
      self.nd, self.nh = d, h
      return
    end
  end
  local d, h = tonumber(nd or 0), tonumber(nh or 0)
  d = d and d <= 1e15 and d or 0
  h = h and h <= 1e15 and h or 0
  self.nd, self.nh = d, h
  if kept and nd and nh then
    self.keep(kept, nd, d)
    self.keep(kept, nh, h)
  end
end

-- The hint last given to a queue head, {tag, key, msg} (tag false: none):
-- its list and message are read on first need, and only if META has a
-- hint (P:meta read its tag; most runs find none). A hint without its list
-- (or a list that is no signal list of the pool) is read as none.
function P:hints()
  local h = self.hinted
  if not h then
    if not self.got_meta then
      self:meta()
    end
    h = self.NO_HINT
    local tag = self.hint_tag
    if tag then
      local m = redis.call('HMGET', self.META, 'hintkey', 'hintmsg')
      if m[1] and m[2] and string.sub(m[1], 1, #self.SIG) == self.SIG then
        h = {tag, m[1], m[2]}
      end
    end
    self.hinted = h
  end
  return h
end

-- The pool's event log (`<p>:events`, a stream), where its operator switched it
-- on (META `ev`: about how many entries it keeps, set_events.lua): one
-- entry per grant, release, expiry, reclaim, revocation, quarantine and
-- dropped waiter, with fields `kind`, `resource`, `token`, `client` (and
-- `owner` where the run has it at hand: a grant, a drop). The entry's id is
-- the server time. Never the lease id: it gives power over the lease, and
-- the log is read by whoever may read the pool. Off, it costs a test.
function P:event(kind, res, token, cid, owner)
  if not self.got_meta then
    self:meta()
  end
  if self.ev then
    -- Named here (P:key): a field of P for it would cost every run of
    -- every script, the log being off or not.
    local key = self:key('events')
    if owner then
      redis.call('XADD', key, 'MAXLEN', '~', self.ev, '*', 'kind', kind,
        'resource', res, 'token', token, 'client', cid, 'owner', owner)
    else
      redis.call('XADD', key, 'MAXLEN', '~', self.ev, '*', 'kind', kind,
        'resource', res, 'token', token, 'client', cid)
    end
  end
end

-- The pool's keys, in the order of P.SUFFIXES, for the scripts that look
-- at all of them (delete, gc, status).
function P:pool_keys()
  local keys = {}
  for i, suffix in ipairs(self.SUFFIXES) do
    keys[i] = self:key(suffix)
  end
  return keys
end

-- The pool's key of this suffix (P.SUFFIXES), for the keys that are not
-- named for every call (prelude_state.lua): the event log, the tenant index.
function P:key(suffix)
  return string.sub(self.META, 1, -5) .. suffix
end

-- Entries waiting: the stream holds only the tickets of waiting requests
-- (and the place-holders of waiting multi requests): a grant deletes its
-- ticket (P:deliver). One O(1) read, cheaper than looking at the head.
function P:waiting()
  return redis.call('XLEN', self.Q)
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

-- The queue head: the first entry of the stream.
function P:peek()
  local e = redis.call('XRANGE', self.Q, '-', '+', 'COUNT', 1)[1]
  return e and self.ticket_of(e)
end

-- The ticket `id` was granted: it leaves the queue (the lease keeps its
-- id). So the stream holds waiting requests only, and a stream node
-- empties, and goes, as soon as its tickets are served.
function P:deliver(id)
  redis.call('XDEL', self.Q, id)
end

-- The waiter `lid` stops being the hinted head (granted, dropped, left):
-- take back a hint it has not read yet.
function P:unhint(lid)
  local h = self:hints()
  if h[1] and string.sub(h[1], 1, #lid + 1) == lid .. '@' then
    if h[3] ~= '' then
      redis.call('LREM', h[2], '1', h[3])
    end
    redis.call('HDEL', self.META, 'hint', 'hintkey', 'hintmsg')
    self.hinted = self.NO_HINT
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
  local h = self:hints()
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
  if self.ord == 't' then
    -- (tenant order) whoever the index serves after it.
    local nt = self:tenant_next(t)
    if nt then
      self:hint(nt, self_lid, at)
    end
    return
  end
  local e = redis.call('XRANGE', self.Q, '(' .. t.id, '+', 'COUNT', 1)[1]
  if e then
    self:hint(self.ticket_of(e), self_lid, at)
  end
end

-- A waiting ticket whose client is gone (its liveness mark ran out) leaves
-- the queue; so does an entry that was never a waiter's (added or damaged
-- by hand: no record names it), and a lease's ticket that an earlier
-- version kept in the stream for as long as the lease: only the entry goes
-- (the lease ends through end_lease alone, which keeps `used` right), and
-- it counts as no dropped waiter (true: such an orphan). `raw`: the record
-- of its lease id, where the caller read it already (nil: not read).
function P:drop(t, raw)
  if raw == nil then
    raw = t.l and redis.call('HGET', self.RECS, t.l)
  end
  local mine = raw == 'W|' .. t.id
  redis.call('XDEL', self.Q, t.id)
  if raw and not mine and string.sub(raw, 1, #t.id + 3) == 'L|' .. t.id .. '|' then
    if self.ord and not t.x then
      -- (tenant order) out of the index, should it be there.
      self:tenant_line('leave', t.T or '', t.id)
    end
    return true
  end
  if t.x == '1' then
    -- A place-holder entry of a multi request (see P:grant_many): it has
    -- no record and is no waiter of its own.
    self:extras(-1)
    return
  end
  if mine then
    redis.call('HDEL', self.RECS, t.l)
  end
  if t.l then
    self:unhint(t.l)
  end
  if self.ord then
    -- (tenant order) out of its tenant's line too.
    self:tenant_line('leave', t.T or '', t.id)
  end
  self.dropped = self.dropped + 1
  self:note('dropped', 1)
  self:event('drop', '', '', t.c or '', t.o)
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
