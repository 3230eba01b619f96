---------------------------------------------------------------------------
-- The queue
---------------------------------------------------------------------------

-- The pool's bookkeeping in META, read once per run: the last ticket
-- delivered (granted) in queue order, the lower bounds `nd` and `nh` (see
-- P:schedule) and the length of the event log. A damaged field is read so
-- that nothing is lost: `nd` or `nh` that is no time as 0 (maintenance
-- runs, and writes them right); `ld` that is no stream id is met where it
-- is used (P:peek). Read once: a helper that needs META calls it only
-- while `ld` is false (a method call costs about 450 instructions, the
-- test about 130). Each field of an HMGET costs about 2,000 instructions
-- (its lookup in the hash, its place in the reply table): of the hint,
-- only its tag is read here, and its list and message where there is one
-- (P:hints); and where a run read `nd` and `nh` already (P:times), not
-- those.
function P:meta()
  if not self.ld then
    local m
    if self.nd then
      m = redis.call('HMGET', self.META, 'ld', 'ev', 'hint', 'ord')
    else
      m = redis.call('HMGET', self.META, 'ld', 'ev', 'hint', 'ord', 'nd', 'nh')
      self:read_times(m[5], m[6])
    end
    self.ld = m[1] or '0-0'
    if m[2] then
      -- (Set only when on: a field of P costs every run that sets it.)
      self.ev = string.find(m[2], '^[1-9]%d?%d?%d?%d?%d?%d?%d?$') and m[2] or false
    end
    if m[4] then
      -- (The tenant order, prelude_tenants.lua: `<t|b|f>` and `|<oo>`, one
      -- field; set only where it is used. Anything else is fifo.)
      local ord, oo = string.match(m[4], '^([tbf]?)|?(.*)$')
      self.ord = ord and ord ~= '' and ord or false
      self.oo = oo and oo ~= '' and self.is_id(oo) and oo or false
    end
    if m[3] then
      self.hint_tag = m[3]
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

function P:read_times(nd, nh)
  nd, nh = tonumber(nd or 0), tonumber(nh or 0)
  self.nd = nd and nd <= 1e15 and nd or 0
  self.nh = nh and nh <= 1e15 and nh or 0
end

-- The hint last given to a queue head, {tag, key, msg} (tag false: none):
-- its list and message are read on first need, and only if META has a
-- hint (P:meta read its tag; most runs find none). A hint without its list
-- (or a list that is no signal list of the pool) is read as none.
function P:hints()
  local h = self.hinted
  if not h then
    if not self.ld then
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
  if not self.ld then
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

-- Where the queue's granted part ends, when `ld` cannot be read: not
-- known, so the queue is read from its start, P:peek stepping over the
-- tickets that are leased (P:tenant_skip) up to the last ticket in the
-- queue now (`oo`: none after it was granted). Reads only; the next grant
-- saves `ld` (P:deliver), and gc at once (with `oo` in META `ord`).
function P:last_granted()
  local e = redis.call('XREVRANGE', self.Q, '+', '-', 'COUNT', 1)[1]
  if e and (not self.oo or self.id_after(e[1], self.oo)) then
    self.oo = e[1]
  end
  return '0-0'
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
  if not self.ld then
    self:meta()
  end
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
  if e and (self.ord == 't' or self.oo) then
    -- (tenant order) granted tickets lie after `ld`: stepped over.
    e = self:tenant_skip(e)
  end
  return e and self.ticket_of(e)
end

-- The ticket `id` was granted: in queue order, the queue head is now the
-- ticket after it (`ld`). The ticket stays in the stream as long as its
-- lease, which is how gc finds every lease (gc.lua, 1.).
function P:deliver(id)
  if self.ord == 't' then
    -- (tenant order) grants leave queue order: `ld` stays where every
    -- ticket before it is granted (prelude_tenants.lua).
    return
  end
  self.ld = id
  redis.call('HSET', self.META, 'ld', id)
  if self.oo and not self.id_after(self.oo, id) then
    -- (After the tenant order) past the last ticket it may have granted
    -- out of queue order: P:peek need not step over any more.
    self.oo = false
    self:tenant_save()
  end
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
  if self.ord then
    -- (tenant order) out of its tenant's line too.
    self:tenant_line('leave', t.T or '', t.id)
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
