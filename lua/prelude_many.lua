---------------------------------------------------------------------------
-- Several resources at once (acquire_many)
---------------------------------------------------------------------------

-- A request for `n` resources is one place in the queue: its head entry
-- (fields l, c, t and n) and right behind it n - 1 place-holder entries
-- (fields l = `<lid>.<i>`, c, x = '1'), all added in one script run, so
-- nobody is ever between them. At the grant, entry i becomes the ticket of
-- lease i and leaves the queue, as any ticket granted (so release, renew,
-- reclaim and gc treat each lease as any other). META `xw` counts the
-- place-holders still waiting, so that status() counts a waiting multi
-- request once.
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
    if self.ord then
      -- (tenant order) out of its tenant's line too.
      self:tenant_line('leave', t.T or '', t.id)
    end
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
  -- then parsed by lease_load.
  local raws = redis.call('HMGET', self.RECS, unpack(ids))
  local raw = raws[1] or nil
  if raw and string.byte(raw, 1) ~= 76 and not (string.byte(raw, 1) == 87 and
      self.is_id(string.sub(raw, 3))) then
    return nil, nil, raw
  end
  for i = 1, n do
    if raws[i] and string.byte(raws[i], 1) == 76 then -- 'L'
      local L, _, bad = self:lease_load(ids[i], raws[i])
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
