-- The epoch after this process put its leases back into a Redis that lost them: the one
-- another process already wrote, or a new ``r<ms>`` (KEYS[1] the epoch).
local epoch = redis.call('GET', KEYS[1])
if epoch then return epoch end
local t = redis.call('TIME')
epoch = 'r' .. (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('SET', KEYS[1], epoch)
return epoch
