-- bucket_settle.lua: the last step of a stock transfer (bucket_give.lua): the donor forgets
-- the transfer, once its units are in the home bucket (bucket_take.lua answered).
--   KEYS[1] the donor bucket's hash    ARGV[1] the transfer id X
-- The record becomes "xd:X" (done, same value), so a give retried after the settle answers
-- what it gave and gives nothing more.
-- Returns 1 when the record was there, 0 when an earlier settle removed it.
local v = redis.call('HGET', KEYS[1], 'xo:' .. ARGV[1])
if not v then
    return 0
end
redis.call('HDEL', KEYS[1], 'xo:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'xd:' .. ARGV[1], v)
redis.call('HINCRBY', KEYS[1], 'xo', -1)
return 1
