-- acquire: join the queue; be granted at once if nobody is ahead and a
-- resource is free (the uncontended case is this one script run).
--
-- KEYS: the pool's META (lua/README.md, "Keys").
-- ARGV: lid, cid, ttl_ms, alive_ms, blocking ('1' | '0'), bind ('' for none),
--       bind_ttl_ms (read only with a bind), owner (who holds the lease, for
--       people: kept in the ticket's field `o`), reclaim ('1': the lease
--       ends once its holder's presence is gone, P:check_holder; kept in
--       the ticket's field `e`; optional, '0' if left out), info (what the
--       client says of itself on its first acquire in the pool:
--       `<pid>|<version>|<host>`, kept with the time in RECS field
--       `i|<cid>` and removed with its liveness mark by gc; optional),
--       tenant (who the request is for: kept in the ticket's field `T`;
--       optional, '' or left out for none; prelude_tenants.lua)
-- Reply: {'granted', ticket, token, granted_us, deadline_ms, ttl_ms, resource}
--      | {'queued', ticket, hint_ms}   hint_ms: when to look again, -1 for no hint
--      | {'busy'}                      non-blocking, and it could not be granted now
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the record of this lease id is damaged)
local lid, cid, ttl, alive_ms, blocking, bind, bind_ttl, owner =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local alive = tonumber(alive_ms)
local reclaim = ARGV[9] == '1' and string.sub(cid, 1, 2) == 'p.'
-- The arguments (prelude, "Checks"): the common case (short texts, plain
-- numbers) in one cheap test; anything else argument by argument, which
-- names a bad one. The first test passes only what the second would.
-- bind_ttl_ms is read (and checked) only with a binding. (ARGV has no
-- holes: with the last one there, all are.)
if not (owner and alive and lid ~= '' and cid ~= '' and owner ~= '' and #lid <= 128 and
    #cid <= 128 and #owner <= 200 and #bind <= 1024 and #ttl < 12 and
    (blocking == '1' or blocking == '0') and alive >= 1 and alive <= 315360000000 and
    alive % 1 == 0 and ttl:find('^[1-9]%d*$') and
    (bind == '' or (#bind_ttl < 12 and bind_ttl:find('^[1-9]%d*$'))) and
    not lid:find('|', 1, true) and not cid:find('|', 1, true)) then
  local bad = P:arg('acquire', 'lid', lid, 'text', 128, '|') or
    P:arg('acquire', 'cid', cid, 'text', 128, '|') or
    P:arg('acquire', 'ttl_ms', ttl, 'int', 1, 315360000000) or
    P:arg('acquire', 'alive_ms', alive_ms, 'num', 1, 315360000000) or
    P:arg('acquire', 'blocking', blocking, 'flag') or
    (bind ~= '' and (P:arg('acquire', 'bind', bind, 'text', 1024) or
      P:arg('acquire', 'bind_ttl_ms', bind_ttl, 'int', 1, 315360000000))) or
    P:arg('acquire', 'owner', owner, 'text', 200)
  if bad then
    return bad
  end
end

local tenant = ARGV[11] or ''
if tenant ~= '' then
  local bad = P:arg('acquire', 'tenant', tenant, 'tenant', 200)
  if bad then
    return bad
  end
end

local info = ARGV[10]
if info and info ~= '' then
  local bad = P:arg('acquire', 'info', info, 'text', 512)
  if bad then
    return bad
  end
  P:introduce(cid, info, alive)
end

-- A retried call whose first reply was lost finds its own ticket here,
-- instead of queueing a second time.
local L, raw, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end
if L then
  P:claim(lid, L)
  return P.lease_reply(L)
end
local ticket = raw and string.sub(raw, 3)
-- A waiting record whose ticket left the stream (the stream was deleted):
-- queue again.
if ticket and not redis.call('XRANGE', P.Q, ticket, ticket)[1] then
  redis.call('HDEL', P.RECS, lid)
  ticket = nil
end

P:maintain()

local serve = true
if not ticket then
  local ahead = P:waiting() > 0
  if blocking == '0' then
    -- Serve those already waiting first; take a resource only if none is
    -- left waiting afterwards: a non-blocking call never passes anybody.
    if ahead then
      P:dispatch(nil)
      ahead = P:waiting() > 0
    end
    if ahead or not P:free_ok(1) then
      return {'busy'}
    end
  end
  if reclaim then
    -- The caller runs a call of its own: whatever absence a run found is
    -- over (as a heartbeat's, poll.lua), so its lease gets a whole grace.
    redis.call('HDEL', P.RECS, 'p|' .. cid)
  end
  -- Nobody waits and a resource is free: the caller is the head, and is
  -- granted in this run (the uncontended case). The resource is chosen
  -- before the ticket is added, so that the ticket can leave the stream as
  -- it enters it (MAXLEN 0: the stream was empty), with no XDEL after.
  -- (`fresh`: queued in this run, so its wait is none: P:count_wait.)
  local best = redis.call('ZRANGE', P.FREE, '0', '0')[1]
  local t, name, r, binding
  if not ahead and best then
    t = {l = lid, c = cid, t = ttl, o = owner, B = bind_ttl, e = reclaim and '1', fresh = true}
    if bind ~= '' then
      t.b = bind
    end
    if tenant ~= '' then
      t.T = tenant
    end
    -- nil if `best` was a stale member of FREE (P:choose): dispatch looks
    -- again, after the ticket joins the queue.
    name, r, binding = P:choose(t, best)
  end
  local keep = name and '0' or P.NO_TRIM
  if tenant ~= '' then
    -- (tenants) the same entry, with its tenant; META `tu`: tenants are
    -- named in this pool (status shows them).
    local f = {'l', lid, 'c', cid, 't', ttl, 'o', owner}
    if bind ~= '' then
      f[9], f[10], f[11], f[12] = 'b', bind, 'B', bind_ttl
    end
    if reclaim then
      f[#f + 1], f[#f + 2] = 'e', '1'
    end
    f[#f + 1], f[#f + 2] = 'T', tenant
    ticket = redis.call('XADD', P.Q, 'MAXLEN', keep, '*', unpack(f))
    redis.call('HSETNX', P.META, 'tu', '1')
  elseif reclaim then
    if bind == '' then
      ticket = redis.call('XADD', P.Q, 'MAXLEN', keep, '*', 'l', lid, 'c', cid, 't', ttl,
        'o', owner, 'e', '1')
    else
      ticket = redis.call('XADD', P.Q, 'MAXLEN', keep, '*', 'l', lid, 'c', cid, 't', ttl,
        'o', owner, 'b', bind, 'B', bind_ttl, 'e', '1')
    end
  elseif bind == '' then
    -- (The common case, apart: a ticket that waits is added without the
    -- two arguments, which cost its XADD about 1,300 instructions.)
    if name then
      ticket = redis.call('XADD', P.Q, 'MAXLEN', '0', '*', 'l', lid, 'c', cid, 't', ttl,
        'o', owner)
    else
      ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner)
    end
  else
    ticket = redis.call('XADD', P.Q, 'MAXLEN', keep, '*', 'l', lid, 'c', cid, 't', ttl,
      'o', owner, 'b', bind, 'B', bind_ttl)
  end
  if name then
    -- The uncontended case ends here.
    t.id = ticket
    return P.lease_reply(P:grant(t, best, lid, name, r, binding))
  elseif not best then
    -- Nothing is free, so there is nobody to serve. Others wait: the
    -- caller just joins the line (only the head is ever told anything; a
    -- release serves the queue). Nobody waits: the caller is the head, and
    -- only learns when to look again (what dispatch would find, without
    -- looking at the queue and the free set again).
    if not ahead then
      P:hint({id = ticket, l = lid, c = cid}, lid)
    end
    serve = false
  end
  if P.ord then
    -- (tenant order) it waits: in its tenant's line, before anyone is served.
    P:tenant_line('join', tenant, ticket)
  end
end

-- Those ahead are served first, in order; if resources remain, so are we.
if serve then
  L = P:dispatch(lid)
  if L then
    return P.lease_reply(L)
  end
end
redis.call('HSET', P.RECS, lid, 'W|' .. ticket)
local until_ms = P.now + alive
redis.call('ZADD', P.ALIVE, P.istr(until_ms) or until_ms, cid)
return {'queued', ticket, P.self_hint or -1}
