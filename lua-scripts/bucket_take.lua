-- bucket_take.lua: the home's half of a stock transfer (bucket_give.lua): the home bucket's
-- stock + k, at most once per transfer id, and its generation + 1.
--   KEYS[1] the home bucket's hash
--   ARGV[1] the transfer id X    ARGV[2] k, the units the donor gave    ARGV[3] now (ms)
-- "xi:X" stays with the hash (it expires with it): a late finisher that read the donor's
-- "xo:X" before the transfer ended must still find the units taken. Transfers are few (each
-- takes half of what a donor holds), so the fields are few.
-- Returns k when added, 0 when X was taken before, -1 when the hash is missing (nothing is
-- written: a hash holding only a stock would not be a bucket; the rebuild from the databases
-- counts the units the donor gave, whose record it finds).
local x, k = ARGV[1], tonumber(ARGV[2])
if x == '' or not k or k < 1 then
    return redis.error_reply('ERR bucket_take.lua: transfer id, units, now')
end
if redis.call('HEXISTS', KEYS[1], 'stock') == 0 then
    return -1
end
if redis.call('HSETNX', KEYS[1], 'xi:' .. x, ARGV[3]) == 0 then
    return 0
end
redis.call('HINCRBY', KEYS[1], 'stock', k)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
return k
