-- prelude.lua: prepended to every script of a pool. It names the keys, reads
-- the clock once, and holds the helpers that every operation shares. The key
-- layout and the record formats are described in lua/README.md.

local K_META, K_RES, K_GONE, K_FREE, K_PARK, K_Q = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local K_RECS, K_EXP, K_BIND, K_BEXP, K_ALIVE, K_RLOG = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_SIG = KEYS[13]

-- A grant pushed to a waiter's signal list that is still there this long
-- after, was never taken: the waiter is gone, and the grant is taken back.
local PICKUP_MS = 2000
-- Expired leases and ended quarantines handled per maintenance pass of a hot
-- path; gc() loops until everything due is handled.
local BATCH = 64

-- Every deadline is on the server's clock. Scripts are replicated by their
-- effects, so reading TIME here is safe.
local T = redis.call('TIME')
local NOW_US = tonumber(T[1]) * 1000000 + tonumber(T[2])
local NOW = math.floor(NOW_US / 1000)

-- Numbers go to Redis and into records as exact integers: Lua's default
-- number-to-string conversion keeps only 14 significant digits, and tokens
-- and microsecond times have 16.
local function fmt(n)
  return string.format('%.0f', n)
end

-- Fixed-width hex sorts like the number it encodes; 14 digits hold
-- microseconds since the epoch for the next two centuries.
local function hex(n)
  return string.format('%014x', n)
end

-- Split on '|' into at most n fields; the last field keeps any further '|'
-- (records put the free-form resource name last).
local function split(s, n)
  local out, i = {}, 1
  for k = 1, n - 1 do
    local j = string.find(s, '|', i, true)
    if not j then
      out[k] = string.sub(s, i)
      return out
    end
    out[k] = string.sub(s, i, j - 1)
    i = j + 1
  end
  out[n] = string.sub(s, i)
  return out
end

-- Counters of this run, reported by gc().
local RECLAIMED, DROPPED = 0, 0

---------------------------------------------------------------------------
-- Resources
---------------------------------------------------------------------------

-- cap|score|used|fence|state|until|stamp|rcount|rwin|rv
local function res_load(name)
  local raw = redis.call('HGET', K_RES, name)
  if not raw then
    return nil
  end
  local f = split(raw, 10)
  return {
    cap = tonumber(f[1]), score = f[2], used = tonumber(f[3]), fence = tonumber(f[4]),
    state = f[5], untl = tonumber(f[6]), stamp = f[7], rc = tonumber(f[8]),
    rw = tonumber(f[9]), rv = tonumber(f[10]),
  }
end

local function res_save(name, r)
  redis.call('HSET', K_RES, name, table.concat({
    fmt(r.cap), r.score, fmt(r.used), fmt(r.fence), r.state, fmt(r.untl), r.stamp,
    fmt(r.rc), fmt(r.rw), fmt(r.rv)}, '|'))
end

-- The invariant of `free`: a resource is in it iff it is active and has a
-- free slot. `restamp` sends a resource that stays free to the back of its
-- priority class, because it was just used (or just came back).
local function place(name, r, restamp)
  local want = r.state == 'a' and r.used < r.cap
  if r.stamp ~= '' and (restamp or not want) then
    redis.call('ZREM', K_FREE, r.stamp .. name)
    r.stamp = ''
  end
  if want and r.stamp == '' then
    r.stamp = hex(NOW_US)
    redis.call('ZADD', K_FREE, r.score, r.stamp .. name)
  end
end

-- Out of rotation until `untl` (ms): quarantine ('q') or rate throttle ('t').
-- Whoever runs a script after that time brings it back (unpark).
local function park(name, r, state, untl)
  r.state, r.untl = state, untl
  redis.call('ZADD', K_PARK, fmt(untl), name)
end

-- The resource leaves the pool. Its last token is kept in `gone`, so that a
-- re-added resource continues its sequence; leases still on it become void.
local function retire(name, r)
  if r.stamp ~= '' then
    redis.call('ZREM', K_FREE, r.stamp .. name)
  end
  redis.call('ZREM', K_PARK, name)
  redis.call('HDEL', K_RES, name)
  redis.call('HSET', K_GONE, name, fmt(r.fence))
  if r.rc > 0 then
    redis.call('ZREMRANGEBYLEX', K_RLOG, '[' .. name .. '\0', '(' .. name .. '\1')
  end
end

-- After a lease of r ended: a draining resource leaves with its last lease,
-- any other goes back into rotation if it has a free slot now.
local function settle(name, r)
  if r.state == 'd' and r.used <= 0 then
    retire(name, r)
    return
  end
  place(name, r, false)
  res_save(name, r)
end

-- Rate limit, an exact sliding window on the server clock: a grant at time t
-- is allowed iff fewer than rcount grants happened in (t - rwin, t]. The log
-- of a resource is the lex range [name\0, name\1) of `rlog` (names are
-- printable, so \0 and \1 never occur in them); each member ends with the
-- grant time in us, then the token, which keeps members unique.
-- Called after each grant and when a throttle ends: if the budget is spent,
-- park the resource until the oldest grant in the window leaves it.
local function throttle_if_spent(name, r)
  local lo, hi = '[' .. name .. '\0', '(' .. name .. '\1'
  local win = r.rw * 1000
  redis.call('ZREMRANGEBYLEX', K_RLOG, lo, '(' .. name .. '\0' .. hex(NOW_US - win + 1))
  if redis.call('ZLEXCOUNT', K_RLOG, lo, hi) < r.rc then
    return
  end
  local oldest = redis.call('ZRANGEBYLEX', K_RLOG, lo, hi, 'LIMIT', 0, 1)[1]
  local at = tonumber(string.sub(oldest, #name + 2, #name + 15), 16)
  park(name, r, 't', math.ceil((at + win) / 1000))
end

---------------------------------------------------------------------------
-- Leases
---------------------------------------------------------------------------

-- L|ticket|token|granted_us|deadline_ms|ttl_ms|cid|mode|pickup|resource
-- Returns the lease (or nil) and the raw record (a waiting record is W|ticket).
local function lease_load(lid)
  local raw = redis.call('HGET', K_RECS, lid)
  if not raw or string.sub(raw, 1, 1) ~= 'L' then
    return nil, raw
  end
  local f = split(raw, 10)
  return {
    ticket = f[2], token = tonumber(f[3]), granted = tonumber(f[4]), deadline = tonumber(f[5]),
    ttl = tonumber(f[6]), cid = f[7], mode = f[8], pickup = f[9], res = f[10],
  }, raw
end

local function lease_save(lid, L)
  redis.call('HSET', K_RECS, lid, table.concat({
    'L', L.ticket, fmt(L.token), fmt(L.granted), fmt(L.deadline), fmt(L.ttl), L.cid, L.mode,
    L.pickup, L.res}, '|'))
end

local function lease_reply(L)
  return {'granted', L.ticket, fmt(L.token), fmt(L.granted), fmt(L.deadline), fmt(L.ttl), L.res}
end

-- Where a waiter listens: one list per acquire ('l'), or one per client
-- object that routes to its local waiters ('c').
local function sig_key(lid, cid, mode)
  if mode == 'c' then
    return K_SIG .. cid
  end
  return K_SIG .. lid
end

-- The grant message is built from fields that never change, so that a later
-- script can find it in the list again (LPOS) or take it out (LREM).
local function grant_msg(lid, L)
  return table.concat({'g', lid, L.ticket, fmt(L.token), fmt(L.granted), fmt(L.ttl), L.res}, '|')
end

-- A lease counts (is one of its resource's `used`) unless the resource left
-- the pool or was removed and added again since the grant (token <= rv).
local function counted(L, r)
  return r ~= nil and L.token > r.rv
end

-- End a lease record: release, expiry, revocation, pick-up take-back, or a
-- cancel that raced a grant. The ticket is acked and deleted, so the stream
-- only holds live tickets. Returns the resource record with `used` lowered
-- (not yet saved, so the caller may park it first), or nil if the lease no
-- longer counted.
local function end_lease(lid, L)
  redis.call('HDEL', K_RECS, lid)
  redis.call('ZREM', K_EXP, lid)
  redis.call('XACK', K_Q, 'g', L.ticket)
  redis.call('XDEL', K_Q, L.ticket)
  local r = res_load(L.res)
  if counted(L, r) then
    r.used = r.used - 1
    return r
  end
  return nil
end

local function end_and_settle(lid, L)
  local r = end_lease(lid, L)
  if r then
    settle(L.res, r)
  end
end

---------------------------------------------------------------------------
-- Maintenance: every script starts by handling what came due.
---------------------------------------------------------------------------

-- Leases whose `exp` time passed. A pushed grant whose pick-up window ended
-- is confirmed if the waiter popped it, taken back if it is still in the
-- list; any other due lease is past its deadline and ends.
local function reclaim(limit)
  local due = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', NOW, 'LIMIT', 0, limit)
  for _, lid in ipairs(due) do
    local L = lease_load(lid)
    if not L then
      redis.call('ZREM', K_EXP, lid)
    else
      local key, msg = sig_key(lid, L.cid, L.mode), nil
      if L.pickup == '1' then
        msg = grant_msg(lid, L)
      end
      if msg and L.deadline > NOW and not redis.call('LPOS', key, msg) then
        L.pickup = '0'
        lease_save(lid, L)
        redis.call('ZADD', K_EXP, fmt(L.deadline), lid)
      else
        if msg then
          redis.call('LREM', key, 1, msg)
        end
        end_and_settle(lid, L)
        RECLAIMED = RECLAIMED + 1
      end
    end
  end
  return #due
end

-- Quarantines and rate throttles that ended: back into rotation, unless the
-- rate budget is still spent (then parked again until it frees).
local function unpark(limit)
  local due = redis.call('ZRANGEBYSCORE', K_PARK, '-inf', NOW, 'LIMIT', 0, limit)
  for _, name in ipairs(due) do
    redis.call('ZREM', K_PARK, name)
    local r = res_load(name)
    if r and (r.state == 'q' or r.state == 't') then
      r.state, r.untl = 'a', 0
      if r.rc > 0 then
        throttle_if_spent(name, r)
      end
      place(name, r, true)
      res_save(name, r)
    end
  end
  return #due
end

local function maintain()
  reclaim(BATCH)
  unpark(BATCH)
end

---------------------------------------------------------------------------
-- The queue
---------------------------------------------------------------------------

-- The last ticket delivered to the group, read once per run.
local LD = nil
-- The hint last pushed to a queue head: {tag, key, msg}, read once per run.
local HINT = nil
-- When the caller itself is the blocked head: ms until it should look again.
local SELF_HINT = nil

-- A stream entry as a table: id, and the fields l, c, m, t (and b, B).
local function ticket_of(e)
  local t = {id = e[1]}
  local f = e[2]
  for i = 1, #f, 2 do
    t[f[i]] = f[i + 1]
  end
  return t
end

-- The queue head: the first ticket after the last one delivered.
local function peek()
  if LD == nil then
    LD = redis.call('HGET', K_META, 'ld') or '0-0'
  end
  local e = redis.call('XRANGE', K_Q, '(' .. LD, '+', 'COUNT', 1)[1]
  return e and ticket_of(e)
end

-- Deliver the head to the consumer group: from now on it is pending, and gc
-- finds it with XAUTOCLAIM. A missing group (deleted, or a new stream) is
-- created again just after the last ticket delivered, never at '$', which
-- would skip tickets already queued.
local function deliver(id)
  local ok = redis.pcall('XREADGROUP', 'GROUP', 'g', 'd', 'COUNT', 1, 'STREAMS', K_Q, '>')
  if type(ok) == 'table' and ok.err then
    redis.call('XGROUP', 'CREATE', K_Q, 'g', LD, 'MKSTREAM')
    redis.call('XREADGROUP', 'GROUP', 'g', 'd', 'COUNT', 1, 'STREAMS', K_Q, '>')
  end
  LD = id
  redis.call('HSET', K_META, 'ld', id)
end

local function load_hint()
  if HINT == nil then
    HINT = redis.call('HMGET', K_META, 'hint', 'hintkey', 'hintmsg')
  end
  return HINT
end

-- The waiter `lid` stops being the hinted head (granted, dropped, left):
-- take back a hint it has not read yet.
local function unhint(lid)
  local h = load_hint()
  if h[1] and string.sub(h[1], 1, #lid + 1) == lid .. '@' then
    if h[3] ~= '' then
      redis.call('LREM', h[2], 1, h[3])
    end
    redis.call('HDEL', K_META, 'hint', 'hintkey', 'hintmsg')
    HINT = {false, false, false}
  end
end

-- The earliest time at which something may unblock the head: a lease
-- deadline or pick-up check, or the end of a quarantine or rate throttle.
local function next_event()
  local a = redis.call('ZRANGE', K_PARK, 0, 0, 'WITHSCORES')[2]
  local b = redis.call('ZRANGE', K_EXP, 0, 0, 'WITHSCORES')[2]
  if a and b then
    return math.min(tonumber(a), tonumber(b))
  end
  return tonumber(a or b)
end

-- The head cannot be served now: tell it when to look again, so that it
-- wakes then instead of polling. Only the head is told (it is the only one
-- that can be served next), and only once per head and time.
local function hint(t, self_lid)
  local wake = next_event()
  if not wake then
    return
  end
  local delay = math.max(wake - NOW, 1)
  local tag = t.l .. '@' .. fmt(wake)
  local h = load_hint()
  if t.l == self_lid then
    SELF_HINT = delay
  end
  if h[1] == tag then
    return
  end
  if h[1] and h[3] ~= '' then
    redis.call('LREM', h[2], 1, h[3])
  end
  local key, msg = sig_key(t.l, t.c, t.m), ''
  if t.l ~= self_lid then
    msg = 'h|' .. t.l .. '|' .. fmt(delay)
    redis.call('RPUSH', key, msg)
  end
  redis.call('HSET', K_META, 'hint', tag, 'hintkey', key, 'hintmsg', msg)
  HINT = {tag, key, msg}
end

-- A ticket whose client is gone (its liveness mark ran out) leaves the queue.
local function drop(t)
  redis.call('XDEL', K_Q, t.id)
  redis.call('HDEL', K_RECS, t.l)
  unhint(t.l)
  DROPPED = DROPPED + 1
end

local function alive(cid)
  local s = redis.call('ZSCORE', K_ALIVE, cid)
  return s and tonumber(s) >= NOW
end

local function best_free()
  local m = redis.call('ZRANGE', K_FREE, 0, 0)[1]
  local name = string.sub(m, 15)
  return name, res_load(name)
end

-- Which free resource the head gets. With soft binding: the bound resource if
-- it is free, before any other; else the best free one, and the binding moves
-- there only if there was none (or it expired) or its resource left the pool.
-- Returns name, record, and what happened to the binding.
local function choose(t)
  if not t.b then
    local name, r = best_free()
    return name, r, nil
  end
  local bound = redis.call('HGET', K_BIND, t.b)
  if bound then
    local until_ms = tonumber(redis.call('ZSCORE', K_BEXP, t.b) or 0)
    if until_ms > NOW then
      local r = res_load(bound)
      if r and r.stamp ~= '' then
        return bound, r, 'hit'
      end
      local name, best = best_free()
      return name, best, (r and 'miss' or 'moved')
    end
  end
  local name, r = best_free()
  return name, r, 'moved'
end

-- Grant the head a free resource. The ticket becomes pending in the group;
-- the token is the resource's next, floored on the server clock in us so
-- that tokens keep growing even after a restart that lost data. A waiter
-- other than the caller is told by a push to its signal list; that grant
-- must be popped within PICKUP_MS or it is taken back.
local function grant(t, self_lid)
  local name, r, binding = choose(t)
  deliver(t.id)
  unhint(t.l)
  local token = math.max(r.fence + 1, NOW_US)
  r.fence = token
  r.used = r.used + 1
  if r.rc > 0 then
    redis.call('ZADD', K_RLOG, 0, name .. '\0' .. hex(NOW_US) .. hex(token))
    throttle_if_spent(name, r)
  end
  place(name, r, true)
  res_save(name, r)

  local ttl = tonumber(t.t)
  local L = {
    ticket = t.id, token = token, granted = NOW_US, deadline = NOW + ttl, ttl = ttl,
    cid = t.c, mode = t.m, pickup = '0', res = name,
  }
  local check = L.deadline
  if t.l ~= self_lid then
    L.pickup = '1'
    check = math.min(NOW + PICKUP_MS, L.deadline)
    redis.call('RPUSH', sig_key(t.l, t.c, t.m), grant_msg(t.l, L))
  end
  lease_save(t.l, L)
  redis.call('ZADD', K_EXP, fmt(check), t.l)

  if binding then
    if binding == 'hit' then
      redis.call('HINCRBY', K_META, 'bhit', 1)
    else
      redis.call('HINCRBY', K_META, 'bmiss', 1)
      if binding == 'moved' then
        redis.call('HSET', K_BIND, t.b, name)
      end
    end
    redis.call('ZADD', K_BEXP, fmt(NOW + tonumber(t.B)), t.b)
  end
  return L
end

-- Serve the queue in order while resources are free. Tickets of clients that
-- are gone are dropped on the way, in one loop however many there are. Stops
-- at the first live waiter that cannot be served, and tells it when to look
-- again. Returns the caller's lease if the caller (self_lid) was served; the
-- caller is never pushed to: its reply carries the grant.
local function dispatch(self_lid)
  local mine = nil
  while true do
    local t = peek()
    if not t then
      break
    end
    if t.l ~= self_lid and not alive(t.c) then
      drop(t)
    elseif redis.call('ZCARD', K_FREE) == 0 then
      hint(t, self_lid)
      break
    else
      local L = grant(t, self_lid)
      if t.l == self_lid then
        mine = L
      end
    end
  end
  return mine
end

local function waiting()
  return math.max(redis.call('XLEN', K_Q) - redis.call('ZCARD', K_EXP), 0)
end
