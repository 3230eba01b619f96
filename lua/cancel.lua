-- cancel: a waiter gives up (timeout, task cancellation, KeyboardInterrupt).
-- It leaves the queue; a grant that raced in is ended and passed on to the
-- next waiter in this same run, so that nothing leaks.
--
-- KEYS: the pool's keys, then KEYS[14] the caller's signal key.
-- ARGV: lid, mode ('l': the signal key is the caller's alone and is deleted)
-- Reply: {'cancelled'} left the queue | {'released'} a raced grant was passed on
--      | {'gone'} nothing to do (already cancelled, or never queued)
local lid, mode = ARGV[1], ARGV[2]

maintain()
local out = 'gone'
local L, raw = lease_load(lid)
if L then
  if L.pickup == '1' then
    redis.call('LREM', KEYS[14], 1, grant_msg(lid, L))
  end
  end_and_settle(lid, L)
  out = 'released'
elseif raw then
  redis.call('XDEL', K_Q, string.sub(raw, 3))
  redis.call('HDEL', K_RECS, lid)
  unhint(lid)
  out = 'cancelled'
end
if mode == 'l' then
  redis.call('DEL', KEYS[14])
end
dispatch(nil)
return {out}
