-- Whether client `cid` lives: its liveness mark has not run out, and, if it
-- keeps a presence, it has not been absent for GRACE_MS. A client absent
-- within its grace lives, and the second value is when it will count as
-- gone (P:gone_at).
function P:alive(cid)
  local s = redis.call('ZSCORE', self.ALIVE, cid)
  if not s or tonumber(s) < self.now then
    return false
  end
  local at = self:gone_at(cid)
  if not at then
    return true
  elseif at > self.now then
    return true, at
  end
  return false
end

-- When client `cid` counts as gone by its presence alone: nil while it is
-- connected, false where nobody can tell (it keeps no presence, or the
-- server cannot count), else the end of its grace, GRACE_MS after the
-- first run that found it absent (RECS field `p|<cid>` holds since when;
-- it goes once the client is found again or runs a call of its own, or
-- with its mark in gc).
function P:gone_at(cid)
  if string.sub(cid, 1, 2) ~= 'p.' then
    return false
  end
  local here = self:present(cid)
  local field = 'p|' .. cid
  local since = redis.call('HGET', self.RECS, field)
  if here ~= false then
    if since then
      redis.call('HDEL', self.RECS, field)
    end
    if here == nil then
      return false
    end
    return nil
  end
  if not since then
    since = self.now
    redis.call('HSET', self.RECS, field, since)
  end
  self:sweep(since == self.now)
  return tonumber(since) + self.GRACE_MS
end

-- A client was found absent: check the presence of the next SWEEP clients
-- of ALIVE (by rank, from META's cursor `pc`) and start the grace of each
-- one that is absent too, so that the clients of a crowd that died
-- together are gone together, a grace after the first was found, however
-- many there are ahead of a live waiter. Once per run, bounded; a sweep
-- that did not reach the end of ALIVE leaves `pc`, and every run that
-- meets an absent client goes on from there (`fresh`: this run found a new
-- absence, which starts a sweep from the start if none is under way).
-- ALIVE holds the clients that wait (their liveness marks); a holder's
-- presence is checked by its leases' own checks (P:check_holder). An
-- absence marked here is ended like any other, by the client's return
-- (present.lua) or a run that finds it connected (P:gone_at).
function P:sweep(fresh)
  if self.swept then
    return
  end
  self.swept = true
  local pc = redis.call('HGET', self.META, 'pc')
  local from = tonumber(pc or '0') or 0
  if not pc and not fresh then
    return
  end
  local cids = redis.call('ZRANGE', self.ALIVE, from, from + self.SWEEP - 1)
  for _, cid in ipairs(cids) do
    if string.sub(cid, 1, 2) == 'p.' and self:present(cid) == false then
      redis.call('HSETNX', self.RECS, 'p|' .. cid, self.now)
    end
  end
  if #cids < self.SWEEP then
    if pc then
      redis.call('HDEL', self.META, 'pc')
    end
  else
    redis.call('HSET', self.META, 'pc', self.istr(from + self.SWEEP) or from + self.SWEEP)
  end
end

-- Is client `cid` connected right now: does a connection subscribe to its
-- presence channel? A process that dies has its sockets closed by its
-- kernel, and the server drops them at once; a stopped or stalled one keeps
-- them. Sharded channels (SSUBSCRIBE, counted with SHARDNUMSUB) where the
-- server has them (Redis >= 7, Valkey: they live in the pool's cluster
-- slot), plain ones on 6.2. nil where the server cannot tell (an ACL
-- without PUBSUB, a server without the command): the mark alone decides.
function P:present(cid)
  local channel = string.sub(self.SIG, 1, -3) .. 'p:' .. cid
  local verb = redis.REDIS_VERSION_NUM and 'SHARDNUMSUB' or 'NUMSUB'
  local reply = redis.pcall('PUBSUB', verb, channel)
  if type(reply) ~= 'table' or reply.err or not reply[2] then
    return nil
  end
  return tonumber(reply[2]) > 0
end

-- What client `cid` says of itself when it joins the pool (its first
-- acquire there): `info` (`<pid>|<version>|<host>`) with the time, in RECS
-- field `i|<cid>` (clients.lua shows it). Kept once; it goes with the
-- client's liveness mark (gc), which it starts if there is none, so that
-- a client that never waits leaves nothing behind.
function P:introduce(cid, info, alive)
  if redis.call('HSETNX', self.RECS, 'i|' .. cid, self.now .. '|' .. info) == 1 then
    redis.call('ZADD', self.ALIVE, 'NX', self.now + alive, cid)
  end
end

-- Tell the holder of lease `lid` that it ended (revoked, reclaimed, its
-- resource removed or its pool deleted by force): `e|<lease id>` on its
-- client's presence channel, which its presence connection already
-- listens to (allocator/_core/presence.py, `Holds.ended`), so that its
-- `lost()` turns true at once. SPUBLISH where P:present counts with
-- SHARDNUMSUB, PUBLISH on 6.2. Only for a client that keeps a presence;
-- a failure (an ACL without the channel) tells nobody and changes nothing.
function P:tell_end(lid, cid)
  if string.sub(cid, 1, 2) == 'p.' then
    redis.pcall(redis.REDIS_VERSION_NUM and 'SPUBLISH' or 'PUBLISH',
      string.sub(self.SIG, 1, -3) .. 'p:' .. cid, 'e|' .. lid)
  end
end
