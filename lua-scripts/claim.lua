-- claim.lua: the claim gate of one user on one coupon template (replaces the reference's
-- stock_decrement_and_save_user_receive.lua; fixes D1-D4, D15, D18).
--
-- Keys (both carry the hash tag {<templateId>}, so they live in one Redis Cluster slot):
--   KEYS[1] quan:tpl:{<templateId>}               hash; fields used here: stock, status,
--                                                  validStartTime, validEndTime (epoch ms)
--   KEYS[2] quan:tpl:{<templateId>}:user:<userId>  string counter: coupons this user claimed
-- Arguments:
--   ARGV[1] now (epoch ms)
--   ARGV[2] limitPerPerson (>= 1)
--   ARGV[3] validEndTime (epoch ms): the counter expires then (PEXPIREAT, not EXPIRE: D1)
-- Returns an array {result, count}, never a bit-packed integer (D4):
--   {0, n}  success: stock - 1, counter incremented; n = the new count (receive_count, from 1: D3)
--   {1, n}  stock exhausted                     (n = the user's current count)
--   {2, n}  per-user limit reached              (n = the user's current count)
--   {3, n}  template not active (status ~= 0: D15)
--   {4, n}  outside the claim window (now < validStartTime or now > validEndTime)
--   {5, 0}  cache missing or partial (hash absent, or a field missing): reload, then retry (D2)

local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local end_ms = tonumber(ARGV[3])
if not now or not limit or limit < 1 or not end_ms then
    return redis.error_reply('ERR claim.lua: bad arguments (now, limitPerPerson, validEndTime)')
end

local f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime')
local stock, status = tonumber(f[1]), tonumber(f[2])
local start_ms, tpl_end_ms = tonumber(f[3]), tonumber(f[4])
if not stock or not status or not start_ms or not tpl_end_ms then
    return {5, 0}
end

local count = tonumber(redis.call('GET', KEYS[2])) or 0
if status ~= 0 then
    return {3, count}
end
if now < start_ms or now > tpl_end_ms then
    return {4, count}
end
if stock <= 0 then
    return {1, count}
end
if count >= limit then
    return {2, count}
end

redis.call('HINCRBY', KEYS[1], 'stock', -1)
count = redis.call('INCR', KEYS[2])
-- Every time, not only on the first claim: harmless, and repairs a counter left without TTL.
redis.call('PEXPIREAT', KEYS[2], end_ms)
return {0, count}
