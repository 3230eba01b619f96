---------------------------------------------------------------------------
-- Tenants: the `tenant` order (docs/concepts.md#tenants)
---------------------------------------------------------------------------

-- A request names its tenant (the ticket's field `T`; none: the tenant '').
-- Under the order `fifo` (the default: META `ord` absent) the queue is
-- served in stream order and the tenant is only recorded, and counted in
-- TEN `g|<tenant>` when it is granted. Under `tenant` (META `ord` = 't'), a
-- resource that frees goes to the first waiter, by arrival, of the waiting
-- tenant with the least count, ties to the tenant whose first waiter came
-- first: start-time fair queueing over tenants. Each grant adds its
-- tenant's step to its count, 10000 / weight (TEN `w|<tenant>`, default 1);
-- a tenant that starts waiting again has its count raised to the least
-- count of the tenants waiting, or with nobody waiting to the start of the
-- last grant (TEN `v`), so that it banks no credit from its idle time.
--
-- The queue stays the stream; the index only says who is next, and each
-- change of it is O(log n) in waiters and tenants:
-- TW (`<p>:tw`), the waiting tickets by tenant, all scores 0,
--   members `<tenant>\0<ticket id in fixed width, 15 and 10 digits>`: a
--   tenant's line is a lex range in arrival order (tenants hold no control
--   character);
-- TQ (`<p>:tq`), the waiting tenants in the order they are
--   served, all scores 0, members `<count: 14 hex><its first ticket, in
--   fixed width><tenant>`, changed by a remove and an add;
-- TEN (`<p>:tenants`), per tenant `c|` its count (14 hex), `w|`
--   its weight, `g|` its grants; `v` the start of the last grant (14 hex).
-- The keys are named by P:key (as P:event names the log): a field of P
-- for them would cost every run under `fifo` too.
-- While the order is `tenant` the index holds every waiting ticket (a
-- ticket joins it in the run that queues it); switching to it builds the
-- index in bounded steps (set_order.lua, META `ord` = 'b' meanwhile, the
-- queue still served in stream order); switched back to `fifo`, the index
-- is kept up until it empties (`ord` = 'f', P:tenant_line), so that a
-- switch to `tenant` then is one step. A grant takes its ticket out of the
-- stream in any order (P:deliver): the stream's head is the first waiting
-- request whatever the order was.

-- The upkeep of the index for ticket `id` of tenant T (`op`):
-- 'join'  it waits: in its tenant's line; a tenant that did not wait enters
--         TQ, its count raised to the floor. `mend` (gc): a ticket there
--         already has its tenant's entry in TQ checked;
-- 'leave' it stops waiting ungranted (cancel, a dead waiter dropped);
-- 'grant' it was granted: counted in its tenant's grants (a named one,
--         whatever the order); under `tenant`, its tenant's count grows by
--         its step, from the floor if it was not waiting (an uncontended
--         grant counts too).
-- T nil: read from the ticket itself (cancel).
function P:tenant_line(op, T, id, mend)
  local tw, tq, ten = self:key('tw'), self:key('tq'), self:key('tenants')
  if op == 'grant' then
    if T ~= '' then
      self:add(ten, 'g|' .. T, '1')
    end
    if not self.ord then
      return
    end
  elseif not T then
    local e = redis.call('XRANGE', self.Q, id, id)[1]
    T = e and self.ticket_of(e).T or ''
  end
  -- The ticket's id in fixed width (15 and 10 digits), so that members
  -- sort as the queue does.
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if not ms or #ms > 15 or #seq > 10 then
    -- (No id the server makes: an entry added by hand is left out.)
    return
  end
  local tid = string.rep('0', 15 - #ms) .. ms .. string.rep('0', 10 - #seq) .. seq
  local me, lo, hi, n = T .. '\0' .. tid, '[' .. T .. '\0', '(' .. T .. '\1', #T + 2
  local added, removed = false, false
  if op == 'join' then
    added = redis.call('ZADD', tw, 'NX', '0', me) == 1
    if not (added or mend) then
      return
    end
  end
  -- Its tenant's first two waiters (after a join, before a leave or grant).
  local line = redis.call('ZRANGEBYLEX', tw, lo, hi, 'LIMIT', '0', '2')
  if op ~= 'join' then
    removed = redis.call('ZREM', tw, me) == 1
  end
  -- Its tenant's entry in TQ changes only if it is (or was) the first, or
  -- with a grant (the count).
  if op ~= 'grant' and line[1] ~= me then
    return
  end
  local f = redis.call('HMGET', ten, 'c|' .. T, 'w|' .. T, 'v')
  -- (A damaged count reads as 0, a damaged weight as 1.)
  local c = f[1] and #f[1] == 14 and tonumber(f[1], 16) or 0
  local hex = string.format('%014x', c)
  if op == 'join' then
    if not added then
      if not redis.call('ZSCORE', tq, hex .. tid .. T) then
        redis.call('ZADD', tq, '0', hex .. tid .. T)
      end
      return
    elseif line[2] then
      -- (Building: an older ticket found after a newer one of its tenant.)
      redis.call('ZREM', tq, hex .. string.sub(line[2], n) .. T)
    else
      -- The floor: the least count of the tenants waiting, or with nobody
      -- waiting the start of the last grant (`v`).
      local first = redis.call('ZRANGE', tq, '0', '0')[1]
      local floor = first and tonumber(string.sub(first, 1, 14), 16) or
        (f[3] and #f[3] == 14 and tonumber(f[3], 16)) or 0
      if floor > c then
        hex = string.format('%014x', floor)
        redis.call('HSET', ten, 'c|' .. T, hex)
      end
    end
    redis.call('ZADD', tq, '0', hex .. tid .. T)
    return
  elseif op == 'leave' then
    if removed then
      redis.call('ZREM', tq, hex .. tid .. T)
      if line[2] then
        redis.call('ZADD', tq, '0', hex .. string.sub(line[2], n) .. T)
        return
      end
    end
  else
    -- A grant. The start: its tenant's count if it was waiting (its entry
    -- goes, and comes back with the new count while it still waits), else
    -- the floor.
    local s, was = c, line[1]
    if was then
      redis.call('ZREM', tq, hex .. string.sub(was, n) .. T)
      if removed and was == me then
        was = line[2]
      end
    else
      -- (The floor, as for a join.)
      local first = redis.call('ZRANGE', tq, '0', '0')[1]
      s = math.max(c, first and tonumber(string.sub(first, 1, 14), 16) or
        (f[3] and #f[3] == 14 and tonumber(f[3], 16)) or 0)
    end
    local w = tonumber(f[2])
    local step = 10000
    if w and w >= 0.01 and w <= 100 then
      step = math.floor(10000 / w + 0.5)
    end
    hex = string.format('%014x', s + step)
    if was then
      redis.call('ZADD', tq, '0', hex .. string.sub(was, n) .. T)
    end
    redis.call('HSET', ten, 'c|' .. T, hex, 'v', string.format('%014x', s))
    if was then
      return
    end
  end
  -- Its tenant's line emptied. Back under `fifo` (META `ord` = 'f'), the
  -- index is kept until it empties: then it goes, and with it the upkeep.
  if removed and self.ord == 'f' and redis.call('EXISTS', tw) == 0 then
    redis.call('DEL', tq)
    redis.call('HDEL', self.META, 'oc')
    self.ord = false
    self:tenant_save()
  end
end

-- META `ord`, one field that P:meta reads with the rest: the order (`t`,
-- `b`, `f`); removed for fifo.
function P:tenant_save()
  if self.ord then
    redis.call('HSET', self.META, 'ord', self.ord)
  else
    redis.call('HDEL', self.META, 'ord')
  end
end

-- The next waiter under the tenant order, as a ticket: the first of the
-- first tenant in TQ. With `after` (P:hint_next): the waiter served once
-- ticket `after` leaves, the next of its tenant, else the first of the next
-- tenant. An entry whose ticket left the stream (by hand) leaves the index
-- (at most DROP_LIMIT a run: then `more`). With nobody in TQ, the queue's
-- head (P:peek): tickets the index lacks (damage) are not left behind.
function P:tenant_next(after)
  local tw, tq = self:key('tw'), self:key('tq')
  for _ = 1, self.DROP_LIMIT do
    local m, id
    if after then
      local T = after.T or ''
      local ms, seq = string.match(after.id, '^(%d+)%-(%d+)$')
      local tid = ms and string.rep('0', 15 - #ms) .. ms .. string.rep('0', 10 - #seq) .. seq
      local nxt = tid and redis.call('ZRANGEBYLEX', tw, '(' .. T .. '\0' .. tid,
        '(' .. T .. '\1', 'LIMIT', '0', '1')[1]
      if nxt then
        id = string.sub(nxt, #T + 2)
      else
        m = redis.call('ZRANGE', tq, '1', '1')[1]
      end
    else
      m = redis.call('ZRANGE', tq, '0', '0')[1]
      if not m then
        return self:peek()
      end
    end
    id = id or (m and string.sub(m, 15, 39))
    if not id then
      return nil
    end
    -- Back from the fixed width: the leading zeros of each part go. (A
    -- member written by hand may name no stream id: XRANGE refuses it,
    -- and it is met as a ticket gone.)
    local full = string.gsub(string.sub(id, 1, 15), '^0+(%d)', '%1') .. '-' ..
      string.gsub(string.sub(id, 16), '^0+(%d)', '%1')
    local e = redis.pcall('XRANGE', self.Q, full, full)
    e = not e.err and e[1]
    local t = e and self.ticket_of(e)
    if after or t then
      -- (One that is no waiting request's, P:serve drops.)
      return t
    end
    local T = string.sub(m, 40)
    redis.call('ZREM', tq, m)
    redis.call('ZREM', tw, T .. '\0' .. id)
    local nxt = redis.call('ZRANGEBYLEX', tw, '[' .. T .. '\0', '(' .. T .. '\1', 'LIMIT', '0', '1')
    if nxt[1] then
      redis.call('ZADD', tq, '0', string.sub(m, 1, 14) .. string.sub(nxt[1], #T + 2) .. T)
    end
  end
  self.more = true
  return nil
end
