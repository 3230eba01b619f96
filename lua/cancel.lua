-- cancel: a waiter gives up (timeout, task cancellation, KeyboardInterrupt).
-- It leaves the queue; a grant that raced in is ended and passed on to the
-- next waiter in this same run, so that nothing leaks.
--
-- KEYS: the pool's keys, then KEYS[17] the caller's signal key (its client's).
-- ARGV: lid
-- Reply: {'cancelled'} left the queue | {'released'} a raced grant was passed on
--      | {'gone'} nothing to do (already cancelled, or never queued)
local lid = ARGV[1]

P:maintain()
local out = 'gone'
local L, raw = P:lease_load(lid)
if L then
  -- end_lease also takes the grant message off the list if it is unread.
  P:end_and_settle(lid, L)
  out = 'released'
elseif raw then
  redis.call('XDEL', P.Q, string.sub(raw, 3))
  redis.call('HDEL', P.RECS, lid)
  P:unhint(lid)
  out = 'cancelled'
end
if out ~= 'gone' then
  -- An acquire that gave up (timeout, cancellation, interrupt).
  P:note('timeouts', 1)
end
P:dispatch(nil)
return {out}
