---------------------------------------------------------------------------
-- Maintenance: every script starts by handling what came due.
---------------------------------------------------------------------------

-- Pushed grants not yet acknowledged by their client's reader, due for a
-- check. While the client is alive, the grant stays its own: it goes back
-- on the signal list (at the tail) in case a lost reply took it off, and is
-- checked again later; a live waiter never loses a grant to a slow reader.
-- Once the client's liveness has run out (it is gone, or stalled past the
-- liveness window), the grant is taken back and passed on, and the client,
-- should it come back, finds a notice `x|<lease id>` that makes the waiter
-- look again at once.
-- Then leases past their deadline (EXP holds deadlines only).
function P:reclaim(limit)
  local before = self.reclaimed
  local picks = redis.call('ZRANGEBYSCORE', self.PICK, '-inf', self.now, 'LIMIT', '0', limit)
  for _, lid in ipairs(picks) do
    local L = string.sub(lid, 1, 2) ~= 'c|' and self:lease_load(lid)
    if L == false then
      self:check_holder(lid)
    elseif not L or L.pickup ~= '1' then
      redis.call('ZREM', self.PICK, lid)
    else
      local live, gone_at = self:alive(L.cid)
      if gone_at then
        -- Absent within its grace: look again when the grace ends.
        self:schedule(self.PICK, gone_at, lid)
      elseif live then
        local key, msg = self.SIG .. L.cid, self.grant_msg(lid, L)
        redis.call('LREM', key, '1', msg)
        redis.call('RPUSH', key, msg)
        self:schedule(self.PICK, self.now + self.PICKUP_MS, lid)
      else
        self:take_back(lid, L)
      end
    end
  end
  local due = redis.call('ZRANGEBYSCORE', self.EXP, '-inf', self.now, 'LIMIT', '0', limit)
  for _, lid in ipairs(due) do
    local L = self:lease_load(lid)
    if not L then
      redis.call('ZREM', self.EXP, lid)
    elseif L.deadline <= self.now or self:holder_gone(lid, L) then
      self:end_and_settle(lid, L)
      self:tell_end(lid, L.cid)
      self.reclaimed = self.reclaimed + 1
      self:event(L.deadline <= self.now and 'expire' or 'reclaim', L.res, L.token, L.cid)
    end
  end
  self:note('reclaimed', self.reclaimed - before)
  return math.max(#picks, #due)
end

-- The presence check of a lease that ends when its holder is gone (a PICK
-- entry `c|<lease id>`, every CHECK_MS; it goes lazily, at its next time,
-- once the lease ended). The check only sees; the ending is by the lease's
-- EXP entry, brought forward to the end of the holder's grace, so that
-- the head of the queue is told to look again then (P:hint), and checked
-- again there (P:holder_gone). The presence alone decides: a holder that
-- does not wait keeps no liveness mark. Where nobody can tell, the checks
-- stop and the lease ends at its deadline.
function P:check_holder(entry)
  local lid = string.sub(entry, 3)
  local L = self:lease_load(lid)
  local at = L and self:gone_at(L.cid)
  if not L or at == false then
    redis.call('ZREM', self.PICK, entry)
    return
  end
  if at and at < L.deadline then
    self:schedule(self.EXP, at, lid)
  end
  -- The head of the queue looks again then (`nh`), so that a holder's
  -- death is found within a check, not a heartbeat.
  self:schedule(self.PICK, self.now + self.CHECK_MS, entry, nil, true)
end

-- A lease whose EXP entry came due before its deadline: the end of its
-- holder's grace (check_holder). True if the holder is gone (the lease
-- ends); else its entry goes back to its deadline, or to the grace's end
-- if that moved.
function P:holder_gone(lid, L)
  local at = self:gone_at(L.cid)
  if at and at <= self.now then
    return true
  end
  self:schedule(self.EXP, (at and at < L.deadline) and at or L.deadline, lid)
  return false
end

-- Take back a pushed grant that its client never acknowledged, its
-- liveness having run out; the client, should it come back, finds a notice
-- `x|<lease id>` that makes the waiter look again at once.
-- A grant of acquire_many is taken back whole: every other lease of the
-- same request that is still unacknowledged goes with it, in this run
-- (the pick-up checks of its leases are due together, but a batch could
-- part them). Their lease ids are the request's id and `<id>.<i>` for i
-- from 2 (P.many_id): the look goes through them in turn up to the first
-- that is no lease of the same client (one it released already ends the
-- look early; the others are taken back at their own checks). For a
-- single lease it costs one read.
function P:take_back(lid, L)
  local base = string.match(lid, '^[^.]*')
  self:take_one(lid, L)
  for i = 1, 1000 do
    local id = self.many_id(base, i)
    if id ~= lid then
      local S = self:lease_load(id)
      if S and S.cid == L.cid then
        if self:unclaimed(id, S) then
          self:take_one(id, S)
        end
      elseif i > 1 then
        break
      end
    end
  end
end

function P:take_one(lid, L)
  self:end_and_settle(lid, L)
  self.reclaimed = self.reclaimed + 1
  self:event('reclaim', L.res, L.token, L.cid)
  -- A client gone by its presence (absent for a whole grace: its process
  -- died) reads nothing any more: its signal list goes (the grant just
  -- taken back, hints), as gc would delete it with its mark. Otherwise the
  -- notice, only while its liveness mark is still there: gc deletes the
  -- list together with the mark, and must not find it made again after.
  local at = self:gone_at(L.cid)
  if at and at <= self.now then
    redis.call('DEL', self.SIG .. L.cid)
  elseif redis.call('ZSCORE', self.ALIVE, L.cid) then
    redis.call('RPUSH', self.SIG .. L.cid, 'x|' .. lid)
  end
end

-- Quarantines and rate throttles that ended: back into rotation, unless the
-- rate budget is still spent (then parked again until it frees).
function P:unpark(limit)
  local due = redis.call('ZRANGEBYSCORE', self.PARK, '-inf', self.now, 'LIMIT', '0', limit)
  for _, name in ipairs(due) do
    redis.call('ZREM', self.PARK, name)
    local r = self:res_load(name)
    if r and (r.state == 'q' or r.state == 't') then
      self:unpark_one(name, r)
    end
  end
  return #due
end

-- A quarantine or throttle of r ended (its PARK entry is gone): back into
-- rotation, or throttled again at once if its rate budget is spent.
function P:unpark_one(name, r)
  r.state, r.untl = 'a', '0'
  if r.rc ~= '0' then
    self:throttle_if_spent(name, r)
  end
  self:place(name, r, true)
  self:res_save(name, r)
end

-- Handle what is due, if anything can be; then raise `nd` and `nh` to the
-- earliest times still scheduled (they stay in the past if a batch left
-- some due: the next run goes on). `light`: read only `nd` and `nh` of META
-- (P:times), for a run that may need no more of it.
function P:maintain(limit, light)
  if light then
    self:times()
  else
    self:meta()
  end
  if self.nd > self.now then
    return 0, 0
  end
  limit = limit or self.BATCH
  local reclaimed, unparked = self:reclaim(limit), self:unpark(limit)
  local nh = math.min(self:first(self.EXP), self:first(self.PARK), self.wake)
  self.nh, self.nd = nh, math.min(nh, self:first(self.PICK))
  -- A pool that does not exist (deleted, or never made) stays so: a renew
  -- or release of a lease of a deleted pool must not make a key.
  if self.nd < 1e15 or redis.call('EXISTS', self.META) == 1 then
    redis.call('HSET', self.META, 'nd', self.nd, 'nh', self.nh)
  end
  return reclaimed, unparked
end
