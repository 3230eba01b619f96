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

-- Grant the head a free resource. Its ticket leaves the queue (P:deliver);
-- the token is the resource's next, floored on the server clock in us so
-- that tokens keep growing even after a restart that lost data. A waiter
-- other than the caller is told by a push to its signal list; that grant
-- must be popped within PICKUP_MS or it is taken back. nil (and nothing
-- granted) if `best` was a stale member of FREE. `name, r, binding`: what
-- P:choose returned already, for a ticket that never stayed in the stream
-- (acquire.lua, the uncontended case): nothing to choose nor to delete.
function P:grant(t, best, self_lid, name, r, binding)
  if not name then
    name, r, binding = self:choose(t, best)
    if not name then
      return nil
    end
    self:deliver(t.id)
  end
  if t.T or self.ord then
    -- (tenants) the grant counts for its tenant (prelude_tenants.lua).
    self:tenant_line('grant', t.T or '', t.id)
  end
  self:unhint(t.l)
  -- The floor is the common case; a second grant in the same microsecond
  -- (capacity > 1) takes the next number.
  local token, fence = self.now_s, r.fence
  -- (Digits: P:res_load checked them, and a stuck resource is never granted.
  -- Compared as text where both have as many digits, which orders them as
  -- numbers: a fence written by a grant has no leading zero, and one that
  -- has (only damage writes one) is below 10^15, so below the clock either
  -- way. A number is made only for a fence at or past the clock.)
  if #fence > #token or (#fence == #token and fence >= token) then
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

  local deadline = self.now + (t.tn or t.t)
  local dl = self.istr(deadline)
  local L = {
    ticket = t.id, token = token, granted = self.now_s, deadline = deadline, ttl = t.t,
    cid = t.c, pickup = '0', res = name, T = t.T or '', o = t.o or '',
  }
  redis.call('ZADD', self.HELD, '0', name .. '\0' .. t.l)
  self:count_wait(t.id, t.fresh)
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
  if L and self.ord == 't' then
    -- (tenant order) the caller is not last in line: others may be served
    -- too, after it.
    self:serve(nil)
  end
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
  if not self.got_meta then
    self:meta()
  end
  local drops = 0
  -- Clients found gone in this run: a crowd's tickets are dropped without
  -- asking again for each (a client has many waiters, one after another).
  local dead = {}
  while true do
    local best = false
    if not self.none_free then
      best = redis.call('ZRANGE', self.FREE, '0', '0')[1] or false
      self.none_free = not best
    end
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
    local t
    if self.ord == 't' then
      -- (tenant order) the first waiter of the tenant served least.
      t = self:tenant_next()
    else
      t = self:peek()
    end
    if not t then
      return nil
    end
    -- The caller's own ticket was made of checked arguments; any other is
    -- checked before it is served (P.ticket_ok; one without a lease id is
    -- nobody's), and must be a waiting request's: its record is its
    -- waiting record (a place-holder of a multi request has none). Any
    -- other entry (a lease's ticket that an earlier version kept in the
    -- stream, an entry added by hand) is dropped.
    local live, gone_at, raw = true, nil, nil
    if t.l ~= self_lid or not self_lid then
      live = self.ticket_ok(t) and not dead[t.c]
      if live then
        raw = redis.call('HGET', self.RECS, t.l)
        if t.x then
          live = not raw
        else
          live = raw == 'W|' .. t.id
        end
      end
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
      self:drop(t, raw)
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
