-- present: a client confirms its return. Sent by a client that keeps a
-- presence right after each (re)subscription of its presence connection:
-- if the server now counts a subscriber on the client's channel, whatever
-- absence a run found before (RECS field `p|<cid>`) is over, and is never
-- added to a later one. So an absence that ends a lease or drops a waiter
-- is one absence, without a break, from after the client's last confirmed
-- return (docs/concepts.md, "Presence as a session"). A confirmation that
-- finds no subscriber (the connection dropped again before this ran)
-- changes nothing: the client tries again on its next connection.
--
-- ARGV: cid (the client's id; one that keeps no presence is answered -1)
-- Reply: {'present', 1 | 0 | -1}   1: the subscriber is counted, the
--        absence (if any) ended; 0: no subscriber now; -1: the server
--        cannot tell (an ACL without PUBSUB, a client without a presence)
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local cid = ARGV[1]
local bad = P:arg('present', 'cid', cid, 'text', 128, '|')
if bad then
  return bad
end

local here = P:presence_of(cid)
if here == 1 then
  redis.call('HDEL', P.RECS, 'p|' .. cid)
end
return {'present', here}
