-- Leases extended — re-added whatever the count if Redis lost them (FLUSHALL, a pause past
-- their expiry, a restart without data), so they are back at the next extension or at the
-- rejoin: ARGV[1] their ms, [2...] the ids.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ = now + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  for j = 2, #ARGV do redis.call('ZADD', key, until_, ARGV[j]) end
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
end
return 1
