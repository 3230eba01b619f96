-- unquarantine: end a quarantine now (an operator's "this proxy works
-- again"): the resource is back in rotation at once and the queue is served.
-- What ends is a quarantine ('q': by `quarantine`, or by a release with
-- `quarantine=`); a rate throttle ('t') is the resource's own budget and
-- stays, and a draining resource stays draining. If the resource's rate
-- budget is spent, it goes on as throttled (P:unpark_one).
--
-- ARGV: name
-- Reply: {'ended'} | {'none'} (not quarantined) | {'unknown'}
-- Errors: ALLOCATOR-ARG (a bad name: nothing written)
local name = ARGV[1]
local bad = P:arg('unquarantine', 'resource', name, 'name')
if bad then
  return bad
end

P:maintain()
local r = P:res_load(name)
if not r then
  return {'unknown'}
end
if r.state ~= 'q' then
  return {'none'}
end
-- Its PARK entry goes; META's `nd`/`nh` stay lower bounds (at worst the
-- next run does its maintenance a little early).
redis.call('ZREM', P.PARK, name)
P:unpark_one(name, r)
P:dispatch(nil)
return {'ended'}
