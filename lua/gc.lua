-- gc: one bounded step of garbage collection; the client calls it again with
-- the returned cursors until both are done and nothing is left due. Safe to
-- run from any number of processes at once: every step is one atomic run.
--
-- 1. leases past their deadline: those due in `exp`, and every lease
--    record, found page by page (HSCAN of `recs`; each lease's own deadline
--    on the server clock decides, whatever `exp` says);
-- 2. queue entries of waiters that are gone, page by page through the
--    queue (it holds waiting requests only), and any entry that is no
--    waiting request's (added by hand, or a lease's ticket that an earlier
--    version kept in the stream);
-- 3. bindings past their ttl; liveness marks that ran out, with the signal
--    lists and the absence records of those clients;
-- 4. repair: page by page through the resources, each record as the
--    scripts write it (a damaged one mended: P:res_mend), its entries in
--    the index of live leases each naming a lease of it that counts (any
--    other entry, and a damaged lease record behind one, removed), its lease
--    count equal to those entries, its place in FREE and PARK as its state
--    says;
-- 5. then the queue is served.
-- Before all that, each step checks that every key of the pool is of its
-- type (else nothing can be repaired: ALLOCATOR-CORRUPT, nothing written)
-- and repairs damaged fields of META and STATS: the order, a hint without
-- its list, figures that hold no integer (removed: they read as 0). Every
-- record, entry or field set right counts in `repaired`.
--
-- ARGV: lease_cursor ('0' to start), queue_cursor ('' to start),
--       res_cursor ('0' to start, '' to skip), count (1 to 1000)
-- Reply: {'gc', reclaimed, dropped_waiters, expired_bindings, unparked,
--         orphans, repaired, next_lease_cursor ('0': done),
--         next_queue_cursor ('': done), next_res_cursor ('': done),
--         more (1: something due was left for the next step),
--         absent_ms (0, or how long until the last grace ends of the
--         absent clients whose waiters this step met: they are gone then,
--         and the caller walks the queue once more to drop them)}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written); ALLOCATOR-CORRUPT
--         naming a key of the wrong type (nothing written), or, after the
--         step's work, a resource of this page whose fence cannot grow
--         (lua/README.md, "Tokens"): it stays out of rotation.
local lease_cursor, q_cursor, res_cursor, count = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bad = (not (lease_cursor and #lease_cursor < 20 and string.find(lease_cursor, '^%d+$')) and
    P:bad_arg('gc', 'lease_cursor', 'must be a scan cursor', lease_cursor)) or
  (q_cursor ~= '' and not (q_cursor and P.is_id(q_cursor)) and
    P:bad_arg('gc', 'queue_cursor', "must be a stream id or ''", q_cursor)) or
  (res_cursor ~= '' and not (res_cursor and #res_cursor < 20 and
    string.find(res_cursor, '^%d+$')) and
    P:bad_arg('gc', 'res_cursor', "must be a scan cursor or ''", res_cursor)) or
  P:arg('gc', 'count', count, 'int', 1, 1000)
if bad then
  return bad
end
count = tonumber(count)
local more = 0
local orphans = 0
local repaired = 0

-- 0. Keys of another type make every script fail (WRONGTYPE); only the
-- pool's operator can tell what to do with them.
local types = {'hash', 'hash', 'hash', 'zset', 'zset', 'stream', 'hash', 'zset', 'hash', 'zset',
  'zset', 'zset', 'zset', 'zset', 'hash', 'stream', 'zset', 'zset', 'hash'}
local keys = P:pool_keys()
for i, want in ipairs(types) do
  local got = redis.call('TYPE', keys[i])
  got = type(got) == 'table' and got.ok or got
  if got ~= 'none' and got ~= want then
    return redis.error_reply('ALLOCATOR-CORRUPT ' .. keys[i] .. ': a ' .. tostring(got) ..
      ', not a ' .. want .. ' (no script of the pool can run until it is deleted)')
  end
end

-- Damaged fields of META and STATS.
local m = redis.call('HMGET', P.META, 'ld', 'nd', 'nh', 'hint', 'hintkey', 'hintmsg', 'xw',
  'bhit', 'bmiss', 'wseq', 'epoch', 'ord', 'oc')
-- Fields an earlier version kept, unused now: `ld` (its last ticket
-- granted in queue order), and `|<ticket>` after the order.
if m[1] then
  redis.call('HDEL', P.META, 'ld')
end
local state, rest = string.match(m[12] or '', '^([tbf]?)(.*)$')
if m[12] and rest ~= '' and string.sub(rest, 1, 1) == '|' and P.is_id(string.sub(rest, 2)) then
  if state == '' then
    redis.call('HDEL', P.META, 'ord')
  else
    redis.call('HSET', P.META, 'ord', state)
  end
elseif m[12] and not (rest == '' and state ~= '') then
  -- (The tenant order, prelude_tenants.lua: an `ord` no script writes is
  -- fifo; a damaged build cursor restarts the build.)
  redis.call('HDEL', P.META, 'ord', 'oc')
  m[13] = false
  repaired = repaired + 1
end
if m[13] and not P.is_id(m[13]) then
  redis.call('HDEL', P.META, 'oc')
  repaired = repaired + 1
end
for i = 2, 3 do
  -- (maintenance below writes them anew)
  local n = m[i] and tonumber(m[i])
  if m[i] and not (n and n <= 1e15) then
    repaired = repaired + 1
  end
end
if (m[4] or m[5] or m[6]) and not (m[4] and m[5] and m[6] and
    string.sub(m[5], 1, #P.SIG) == P.SIG) then
  redis.call('HDEL', P.META, 'hint', 'hintkey', 'hintmsg')
  repaired = repaired + 1
end
local function figure(v)
  return #v <= 20 and string.find(v, '^-?%d+$')
end
local names = {'xw', 'bhit', 'bmiss', 'wseq'}
for i = 7, 10 do
  if m[i] and not figure(m[i]) then
    redis.call('HDEL', P.META, names[i - 6])
    repaired = repaired + 1
  end
end
-- (An epoch is the server time in us; the next heartbeat sets a new one.)
if m[11] and not string.find(m[11], '^%d+$') then
  redis.call('HDEL', P.META, 'epoch')
  repaired = repaired + 1
end
local counters = redis.call('HGETALL', P.STATS)
for i = 1, #counters, 2 do
  if not (figure(counters[i + 1]) and string.find(counters[i], '^%w+$')) then
    redis.call('HDEL', P.STATS, counters[i])
    repaired = repaired + 1
  end
end

-- gc runs the maintenance pass whatever `nd` says (and so repairs it).
P:meta()
P.nd = 0
local reclaimed_now, unparked = P:maintain(count)
if reclaimed_now >= count or unparked >= count then
  more = 1
end

-- 1. Every lease, whatever EXP says about it: a page of the records
-- (HSCAN of RECS, from the cursor). A lease record: ended if past its
-- deadline or void. A damaged one goes, with its deadline and pick-up
-- check (its entry in the index of live leases goes with the repair of its
-- resource, 4.). Waiting records, and the clients' marks (`p|`, `i|`),
-- are not leases.
local page = redis.call('HSCAN', P.RECS, lease_cursor, 'COUNT', count)
local next_lease = page[1]
local before = P.reclaimed
local fields = page[2]
for i = 1, #fields, 2 do
  local lid, raw = fields[i], fields[i + 1]
  if not string.find(lid, '|', 1, true) and string.byte(raw, 1) ~= 87 then -- 'W'
    local L, _, damaged = P:lease_load(lid, raw)
    if L then
      if L.deadline <= P.now then
        P:end_and_settle(lid, L)
        P:tell_end(lid, L.cid)
        P.reclaimed = P.reclaimed + 1
      elseif not P.counted(L, P:res_load(L.res)) then
        -- Void (its resource was removed with force, or removed and added
        -- again): it was counted among the revoked then, and its holder
        -- told; only its record is left, which its holder's renew or
        -- release would have cleaned up.
        P:end_and_settle(lid, L)
      end
    elseif damaged then
      redis.call('HDEL', P.RECS, lid)
      redis.call('ZREM', P.EXP, lid)
      redis.call('ZREM', P.PICK, lid)
      repaired = repaired + 1
    end
  end
end
P:note('reclaimed', P.reclaimed - before)

-- 2. Waiters that are gone, anywhere in the queue (dispatch drops them only
-- when they reach the head), and entries that are no waiting request's
-- (P:drop: a lease's ticket an earlier version kept in the stream is an
-- orphan).
P:meta()
local from = q_cursor ~= '' and q_cursor or '0-0'
local next_q = ''
local entries = redis.call('XRANGE', P.Q, '(' .. from, '+', 'COUNT', count)
-- A client found absent (its grace starts now, and those of the absent
-- clients that P:sweep finds with it) is not gone yet: the reply says when
-- the last of those graces ends.
local absent_until = 0
for _, e in ipairs(entries) do
  local t = P.ticket_of(e)
  local raw = t.l and redis.call('HGET', P.RECS, t.l)
  local waits = raw == 'W|' .. e[1] or (t.x and not raw)
  local live, at = false, nil
  if waits and P.ticket_ok(t) then
    live, at = P:alive(t.c)
  end
  if not live then
    if P:drop(t, raw) then
      orphans = orphans + 1
    end
  elseif at and at > absent_until then
    absent_until = at
  end
  if P.ord and live and not t.x then
    -- (Under the tenant order every waiting ticket is in the index: one
    -- that is not, damage, joins it.)
    P:tenant_line('join', t.T or '', e[1], true)
  end
end
if #entries >= count then
  next_q = entries[#entries][1]
end

-- 3. Bindings past their ttl, and liveness marks that ran out.
local expired = redis.call('ZRANGEBYSCORE', P.BEXP, '-inf', P.now, 'LIMIT', '0', count)
for _, name in ipairs(expired) do
  redis.call('HDEL', P.BIND, name)
  redis.call('ZREM', P.BEXP, name)
end
if #expired >= count then
  more = 1
end
local gone = redis.call('ZRANGEBYSCORE', P.ALIVE, '-inf', '(' .. P.now, 'LIMIT', '0', count)
for _, cid in ipairs(gone) do
  redis.call('DEL', P.SIG .. cid)
  redis.call('ZREM', P.ALIVE, cid)
  redis.call('HDEL', P.RECS, 'p|' .. cid, 'i|' .. cid)
end
if #gone >= count then
  more = 1
end

-- 4. Every resource's record as the scripts write it, its `used` equal to
-- its entries in the index of live leases (void leases are not in it), and
-- each entry a lease of it. Anything else is damage or a bug's trace: set
-- right, so that no resource stays full, or over-granted, for ever.
local next_res = ''
local stuck = nil
if res_cursor ~= '' then
  local page = redis.call('HSCAN', P.RES, res_cursor, 'COUNT', count)
  for i = 1, #page[2], 2 do
    -- (A page lists what HSCAN saw; each name is in RES: nothing before
    -- this part of the step removes a resource.)
    local name = page[2][i]
    local r = P:res_load(name)
    local fixed = r.bad
    if not P.is_score(r.score) then
      -- (The grant path finds a damaged score only when ZADD refuses it.)
      r.score, fixed = '0', true
    end
    local live = 0
    for _, member in ipairs(redis.call('ZRANGEBYLEX', P.HELD, '[' .. name .. '\0',
        '(' .. name .. '\1')) do
      local lid = string.sub(member, #name + 2)
      local L, _, damaged = P:lease_load(lid)
      if L and L.res == name and P.counted(L, r) then
        live = live + 1
      else
        redis.call('ZREM', P.HELD, member)
        if damaged then
          redis.call('HDEL', P.RECS, lid)
          redis.call('ZREM', P.EXP, lid)
          redis.call('ZREM', P.PICK, lid)
        end
        fixed = true
      end
    end
    if r.used ~= live then
      r.used, fixed = live, true
    end
    -- A quarantine or throttle ends by its PARK entry; FREE holds the
    -- entry the record names, iff the resource can be granted.
    if (r.state == 'q' or r.state == 't') and not redis.call('ZSCORE', P.PARK, name) then
      r.state, r.untl, fixed = 'a', '0', true
    end
    if r.stamp ~= '' and not redis.call('ZSCORE', P.FREE, r.stamp .. name) then
      r.stamp, fixed = '', true
    end
    if (r.stamp ~= '') ~= (r.state == 'a' and r.used < r.cap and not r.stuck) then
      fixed = true
    end
    if fixed then
      if r.state == 'd' and live <= 0 then
        P:retire(name, r)
      else
        -- Placed anew, whatever FREE held for it.
        P:place(name, r, true)
        P:res_save(name, r)
      end
      repaired = repaired + 1
    end
    if r.stuck then
      stuck = stuck or name
    end
  end
  if page[1] ~= '0' then
    next_res = page[1]
  end
end

-- 5. Serve whoever can be served now.
P:dispatch(nil)
-- The count of waiting place-holders (status only) is set right whenever
-- nobody waits: a stream deleted under waiting multi requests left it high.
if P:waiting() <= 0 and redis.call('HGET', P.META, 'xw') then
  redis.call('HDEL', P.META, 'xw')
end
if P.more then
  more = 1
end
if stuck then
  -- Everything else of this step is done (and written); the resource stays
  -- out of rotation until its operator acts.
  return redis.error_reply('ALLOCATOR-CORRUPT ' .. P.RES .. ": resource '" .. P:shown(stuck) ..
    "': its fence cannot grow (lua/README.md, \"Tokens\"): it is out of rotation; " ..
    'remove it and add it under another name')
end
return {'gc', P.reclaimed, P.dropped, #expired, unparked, orphans, repaired, next_lease, next_q,
        next_res, more, absent_until > 0 and math.max(absent_until - P.now, 1) or 0}
