-- This process's metrics for the fleet's view, and everyone's back: KEYS[1] the set of
-- processes (score: when their figures expire); ARGV: id, figures (JSON), ms they last, key
-- prefix of the figures.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('SET', ARGV[4] .. ARGV[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local figures = redis.call('GET', ARGV[4] .. id)
  if figures then table.insert(out, figures) end
end
return out
