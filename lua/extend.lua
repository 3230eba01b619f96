-- extend: add resources, or update existing ones (capacity, priority, rate)
-- keeping their leases. A draining resource is taken back into the pool.
-- Waiters are served at once if the change lets them.
--
-- ARGV: capacity, score (-priority, as a string), rate_count (0: none),
--       rate_window_ms, name...
-- Reply: {'extended', added}
local cap, score, rc, rw = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]

P:maintain()
local added = 0
for i = 5, #ARGV do
  local name = ARGV[i]
  local r = P:res_load(name)
  local restamp = false
  if r then
    restamp = r.score ~= score
    if rc == '0' and r.rc ~= '0' then
      -- The rate is dropped: so is its log.
      redis.call('ZREMRANGEBYLEX', P.RLOG, '[' .. name .. '\0', '(' .. name .. '\1')
    end
    r.cap, r.score, r.rc, r.rw = cap, score, rc, rw
    if r.state == 'd' then
      r.state = 'a'
    end
  else
    -- New, or back after removal: continue its token sequence, and void any
    -- lease left from before it was removed.
    local fence = redis.call('HGET', P.GONE, name) or '0'
    redis.call('HDEL', P.GONE, name)
    -- Nothing of an earlier life counts: no rate log, no indexed lease.
    P:forget(name)
    r = {cap = cap, score = score, used = 0, fence = fence, state = 'a', untl = '0',
         stamp = '', rc = rc, rw = rw, rv = fence}
    added = added + 1
  end
  -- The rate may have changed: a throttle is re-decided under the new one.
  if r.state == 't' then
    redis.call('ZREM', P.PARK, name)
    r.state, r.untl = 'a', '0'
  end
  if r.state == 'a' and r.rc ~= '0' then
    P:throttle_if_spent(name, r)
  end
  P:place(name, r, restamp)
  P:res_save(name, r)
end
P:dispatch(nil)
return {'extended', added}
