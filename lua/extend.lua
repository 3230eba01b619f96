-- extend: add resources, or update existing ones (capacity, priority, rate)
-- keeping their leases. A draining resource is taken back into the pool.
-- Waiters are served at once if the change lets them.
--
-- ARGV: capacity, score (-priority, as a string), rate_count (0: none),
--       rate_window_ms, name...
-- Reply: {'extended', added}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (a resource coming back whose last token, kept in GONE, cannot grow:
--         nothing written)
local cap, score, rc, rw = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bad = P:arg('extend', 'capacity', cap, 'int', 1, 2147483648) or
  (not (score and P.is_score(score)) and
    P:bad_arg('extend', 'score', 'must be a finite number within +-1e15', score)) or
  P:arg('extend', 'rate_count', rc, 'int', 0, 1000000) or
  P:arg('extend', 'rate_window_ms', rw, 'int', rc == '0' and 0 or 1, 315360000000)
for i = 5, #ARGV do
  bad = bad or P:arg('extend', 'resource', ARGV[i], 'name')
end
if bad then
  return bad
end
cap = tonumber(cap)
-- A resource that comes back continues its token sequence from GONE: one
-- whose last token is not a number the sequence can grow from (damage;
-- lua/README.md, "Tokens") is refused, before anything is written.
for i = 5, #ARGV do
  local fence = redis.call('HGET', P.GONE, ARGV[i])
  if fence and not (string.find(fence, '^%d+$') and
      (#fence < 16 or (#fence == 16 and fence < '9007199254740992'))) then
    return redis.error_reply('ALLOCATOR-CORRUPT ' .. P.GONE .. ": the last token of resource '" ..
      P:shown(ARGV[i]) .. "', '" .. P:shown(fence) ..
      "', is no token that can grow (add it under another name)")
  end
end

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
    r.cap, r.cs, r.score, r.rc, r.rw = cap, nil, score, rc, rw
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
