-- Write one answer and keep the fleet's cache within its bounds (the oldest written go
-- first). KEYS: index (zset, score = order of writing), sizes (hash), questions (hash), total
-- size, the order's counter, times written (hash, ms). ARGV: key, blob, size, ttl ms, max
-- entries, max size, entry key prefix, question or "".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
local function drop(member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('DEL', ARGV[7] .. member)
  redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[2], member) or '0'))
  redis.call('HDEL', KEYS[2], member)
  redis.call('HDEL', KEYS[3], member)
  redis.call('HDEL', KEYS[6], member)
end
while true do  -- the expired, oldest first
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not oldest or tonumber(redis.call('HGET', KEYS[6], oldest) or '0') > now - ttl then break end
  drop(oldest)
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then drop(ARGV[1]) end
redis.call('SET', ARGV[7] .. ARGV[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[5]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[6], ARGV[1], now)
redis.call('INCRBY', KEYS[4], tonumber(ARGV[3]))
if ARGV[8] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[8]) end
while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[5])
    or redis.call('INCRBY', KEYS[4], 0) > tonumber(ARGV[6]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not oldest then break end
  drop(oldest)
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ttl * 2) end
return 1
