for i, key in ipairs(KEYS) do redis.call('ZREM', key, ARGV[1]) end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
