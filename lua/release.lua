-- release: end a lease and hand the slot to the next waiter in the same run.
--
-- ARGV: lid, ticket, quarantine_ms ('' for none), unclaimed ('1': only if
--       nobody took the grant yet; a reader releasing a grant whose waiter
--       left, which may have been handed it in a reply meanwhile)
-- Reply: {'released'} | {'lost'}   the lease had already ended (expired,
--        revoked, released before): nothing was changed on its behalf
--      | {'claimed'}               unclaimed was asked, and it was claimed
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the lease's record is damaged)
local lid, ticket, quarantine, unclaimed = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- lid and ticket are looked up, never written: any text Python's checks of
-- a Lease let through (a ticket of another shape finds nothing).
-- The common case in one cheap test, then argument by argument (acquire.lua).
if not (lid and ticket and lid ~= '' and ticket ~= '' and #lid <= 128 and #ticket <= 64 and
    quarantine == '' and unclaimed == '') then
  local bad = P:arg('release', 'lid', lid, 'text', 128) or
    P:arg('release', 'ticket', ticket, 'text', 64) or
    (quarantine ~= '' and P:arg('release', 'quarantine_ms', quarantine, 'int', 0,
      315360000000)) or
    (unclaimed ~= '' and P:arg('release', 'unclaimed', unclaimed, 'flag'))
  if bad then
    return bad
  end
end

P:maintain()
local L, _, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end
if not L or L.ticket ~= ticket then
  P:dispatch(nil)
  return {'lost'}
end
if unclaimed == '1' and not P:unclaimed(lid, L) then
  return {'claimed'}
end
local r = P:end_lease(lid, L)
-- Past its deadline (not yet reclaimed) or void: it was not live any more.
if not r or L.deadline <= P.now then
  if r then
    P:settle(L.res, r)
  end
  P:dispatch(nil)
  return {'lost'}
end
if quarantine ~= '' and r.state ~= 'd' then
  local untl = P.now + tonumber(quarantine)
  if r.state == 'q' or r.state == 't' then
    untl = math.max(untl, tonumber(r.untl))
  end
  P:park(L.res, r, 'q', untl)
  -- A quarantine started by a release (`qr`; an operator's: quarantine.lua).
  P:add(P.STATS, 'qr', '1')
end
P:event('release', L.res, L.token, L.cid)
if quarantine ~= '' and r.state == 'q' then
  P:event('quarantine', L.res, L.token, L.cid)
end
-- With tickets waiting, the resource is kept aside for the queue head, which
-- takes it if it can (P:settle); else it is settled, and there is nobody to
-- serve.
local waits = P:waiting() > 0
P:settle(L.res, r, waits)
if waits then
  P:dispatch(nil, true)
end
return {'released'}
