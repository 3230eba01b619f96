-- clients: one page of the client processes of the pool, read only (see
-- status.lua): those with a liveness mark (they wait, or waited lately),
-- those with a ticket in the queue, and those that hold a lease. The pages
-- walk ALIVE by rank, then the queue (the stream) by id, then the lease
-- index HELD by member, so that no run reads every client of a large pool:
-- the client calls again with the cursor it was given until that is ''.
--
-- For each client the row carries its liveness mark (ALIVE's score: the
-- time of its last heartbeat plus the mark's length, which the caller knows
-- from the id, allocator/_core/presence.py), its presence, and what it said
-- of itself when it joined the pool (RECS field `i|<cid>`, acquire.lua:
-- `<joined ms>|<pid>|<version>|<host>`).
--
-- ARGV: cursor ('' for the first page; then as given: `a<rank>` in ALIVE,
--       `q<stream id>` in the queue, `h<member>` in HELD, `h` at its
--       start), count (entries per page)
-- Reply: {'clients', now_us, next ('' : the last page), kind1, cid1, mark1,
--         present1, info1, kind2, ...}
--        kind: 'a' a liveness mark, 'w' a waiting request, 'l' a live
--        lease; mark: ALIVE's score, '' for none; present as in leases.lua;
--        info: '' if none was recorded
-- Errors: ALLOCATOR-ARG (a bad cursor or count)
local cursor, count = ARGV[1], ARGV[2]
local bad = P:arg('clients', 'count', count, 'int', 1, 10000)
local phase, from = string.sub(cursor or '', 1, 1), string.sub(cursor or '', 2)
if not bad and not (cursor == '' or (phase == 'a' and string.find(from, '^%d+$') and
    #from < 16) or (phase == 'q' and P.is_id(from)) or phase == 'h') then
  bad = P:bad_arg('clients', 'cursor', "must be '', a<rank>, q<stream id> or h<member>", cursor)
end
if bad then
  return bad
end
local n = tonumber(count)

local out = {'clients', P.now_s, ''}
local function row(kind, cid)
  out[#out + 1] = kind
  out[#out + 1] = cid
  out[#out + 1] = redis.call('ZSCORE', P.ALIVE, cid) or ''
  out[#out + 1] = P:presence_of(cid)
  out[#out + 1] = redis.call('HGET', P.RECS, 'i|' .. cid) or ''
end

if cursor == '' or phase == 'a' then
  local rank = cursor == '' and 0 or tonumber(from)
  local cids = redis.call('ZRANGE', P.ALIVE, rank, rank + n - 1)
  for _, cid in ipairs(cids) do
    row('a', cid)
  end
  out[3] = #cids == n and 'a' .. (rank + n) or 'q0-0'
  return out
end

if phase == 'q' then
  local entries = redis.call('XRANGE', P.Q, '(' .. from, '+', 'COUNT', count)
  for _, e in ipairs(entries) do
    local t = P.ticket_of(e)
    -- (A place-holder of a multi request has no record of its own.)
    if t.l and t.c and redis.call('HGET', P.RECS, t.l) == 'W|' .. e[1] then
      row('w', t.c)
    end
  end
  out[3] = #entries == n and 'q' .. entries[#entries][1] or 'h'
  return out
end

local held, live = P:held_page(from, count)
for _, L in ipairs(live) do
  row('l', L.cid)
end
if #held == n then
  out[3] = 'h' .. held[#held]
end
return out
