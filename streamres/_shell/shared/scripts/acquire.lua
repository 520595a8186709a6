-- A slot on every key, or a place in their waiting lines. KEYS[1]: the epoch (below), then
-- the slot sets; ARGV[1] the lease id, [2] its ms, [3] the priority, [4] ms a waiter's place
-- lasts unless renewed, [5] the epoch this process knows ('' if none yet), [6...] the limits.
-- Each set ``K`` has a line ``K:line`` (score: minus the priority times 1e13, plus the ms of
-- arrival: higher lanes first, then first come) and ``K:alive`` (score: when the waiter's
-- place lapses: a crashed process's waiters drop out). A slot is taken only when there are
-- more free slots than waiters ahead; else the waiter keeps (or takes) its place. A request
-- in a background lane (priority BACKGROUND or below) leaves one slot free of a set of two or
-- more, for a person (``_core/lanes.reserve``).
--
-- The epoch is a key written once for a fleet's Redis: ``f<ms>`` when the first process
-- found none, ``r<ms>`` when a process found it gone (FLUSHALL, a restart without data, an
-- eviction) and put its leases back. Returns ``{1|0|-1, epoch}``: taken, wait, or *Redis
-- lost its data* — this process's leases are not in it: put them back first. For
-- ``EPOCH_GRACE`` ms after an ``r`` epoch nothing is taken, so that every process (each
-- checks the epoch every second) has put its leases back before new ones are counted.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  if ARGV[5] ~= '' then return {-1, ''} end
  epoch = 'f' .. now
  redis.call('SET', KEYS[1], epoch)
elseif ARGV[5] ~= '' and ARGV[5] ~= epoch then
  return {-1, epoch}
end
if string.sub(epoch, 1, 1) == 'r' and now < tonumber(string.sub(epoch, 2)) + EPOCH_GRACE then
  return {0, epoch}
end
local lease, rank = ARGV[1], -tonumber(ARGV[3]) * 1e13 + now
local ok = true
for i = 2, #KEYS do
  local key = KEYS[i]
  local line, alive = key .. ':line', key .. ':alive'
  local gone = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  for _, id in ipairs(gone) do
    redis.call('ZREM', line, id)
    redis.call('ZREM', alive, id)
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local mine = redis.call('ZSCORE', line, lease)
  if mine then rank = math.min(rank, tonumber(mine)) end
  local ahead = redis.call('ZCOUNT', line, '-inf', '(' .. string.format('%.17g', rank))
  local limit = tonumber(ARGV[4 + i])
  local spare = 0
  if tonumber(ARGV[3]) <= BACKGROUND and limit >= 2 then spare = 1 end
  if limit - redis.call('ZCARD', key) - spare <= ahead then ok = false end
end
for i = 2, #KEYS do
  local key = KEYS[i]
  local line, alive = key .. ':line', key .. ':alive'
  if ok then
    redis.call('ZADD', key, now + tonumber(ARGV[2]), lease)
    redis.call('PEXPIRE', key, tonumber(ARGV[2]) * 2)
    redis.call('ZREM', line, lease)
    redis.call('ZREM', alive, lease)
  else
    redis.call('ZADD', line, rank, lease)
    redis.call('ZADD', alive, now + tonumber(ARGV[4]), lease)
    redis.call('PEXPIRE', line, tonumber(ARGV[2]) * 2)
    redis.call('PEXPIRE', alive, tonumber(ARGV[2]) * 2)
  end
end
if ok then return {1, epoch} end
return {0, epoch}
