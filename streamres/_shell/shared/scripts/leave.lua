-- A waiter that gave up (its deadline, or cancelled) leaves the lines; the next one may be
-- able to go now, so it is told.
for i, key in ipairs(KEYS) do
  redis.call('ZREM', key .. ':line', ARGV[1])
  redis.call('ZREM', key .. ':alive', ARGV[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
