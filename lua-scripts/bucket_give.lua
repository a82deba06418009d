-- bucket_give.lua: the donor's half of a stock transfer between two buckets of one template
-- (bucket.h), and the look at a bucket the sold-out verdict is made of.
--
-- A transfer X moves k units from a donor bucket to the claim's home bucket in three steps,
-- each one call in one slot: give (here: the donor's stock - k, and the field "xo:X" = "k:to:t"
-- recording that k units are on their way), take (bucket_take.lua: the home's stock + k,
-- once per X, remembered as "xi:X"), settle (bucket_settle.lua: the donor forgets "xo:X").
-- Whoever finds an "xo:X" older than a transfer lives finishes it with the same take and
-- settle, so a crash between any two steps loses nothing and, take being once per X,
-- doubles nothing.
--
--   KEYS[1] the donor bucket's hash     KEYS[2] its reservation set (claim.lua's KEYS[3])
--   ARGV[1] the transfer id X ("" with ARGV[2] 0: only look)
--   ARGV[2] how many units the home wants (0: none); a donor gives at most half of what it
--           holds, rounded up, so it keeps some for its own users and a hot home pulls in
--           few transfers
--   ARGV[3] the home bucket's number    ARGV[4] now (ms)
-- Returns {k, stock, gen, open, xo, X1, v1, X2, v2, ...}: the units given (a retried X
-- answers what it gave the first time, on its way or settled: "xd:X", bucket_settle.lua), then the bucket as the call left it: its stock, its
-- generation (raised by every call that raises the stock: a bucket seen twice at 0 with the
-- same generation held no stock in between), its open reservations, how many transfers out
-- of it are on their way, and those transfers' ids and records when there are any.
-- {-1}: the bucket's hash is missing (load the template first).
local x, want, to, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
if not want or want < 0 or (want > 0 and x == '') then
    return redis.error_reply('ERR bucket_give.lua: transfer id, units, home, now')
end
local f = redis.call('HMGET', KEYS[1], 'stock', 'gen', 'xo')
local stock = tonumber(f[1])
if not stock then
    return {-1}
end
local gen, xo, k = tonumber(f[2]) or 0, tonumber(f[3]) or 0, 0
if want > 0 then
    local prior = redis.call('HGET', KEYS[1], 'xo:' .. x) or redis.call('HGET', KEYS[1], 'xd:' .. x)
    if prior then
        k = tonumber(string.match(prior, '^(%d+)')) or 0
    elseif stock > 0 then
        k = math.min(want, math.floor((stock + 1) / 2))
        stock = stock - k
        xo = xo + 1
        redis.call('HINCRBY', KEYS[1], 'stock', -k)
        redis.call('HINCRBY', KEYS[1], 'xo', 1)
        redis.call('HSET', KEYS[1], 'xo:' .. x, k .. ':' .. to .. ':' .. now)
    end
end
local out = {k, stock, gen, redis.call('ZCARD', KEYS[2]), xo}
if xo > 0 then
    local cursor = '0'
    repeat
        local page = redis.call('HSCAN', KEYS[1], cursor, 'MATCH', 'xo:*', 'COUNT', 100)
        cursor = page[1]
        for i = 1, #page[2], 2 do
            out[#out + 1] = string.sub(page[2][i], 4)
            out[#out + 1] = page[2][i + 1]
        end
    until cursor == '0'
end
return out
