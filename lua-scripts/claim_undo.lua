-- claim_undo.lua: gives back a successful claim whose database write failed or was refused
-- (no reservation is left behind without a coupon row): stock + 1 and the user's counter - 1.
--
-- Keys (same layout and hash tag as claim.lua):
--   KEYS[1] quan:tpl:{<templateId>}                        template hash (field stock)
--   KEYS[2] quan:tpl:{<templateId>}:user:<userId>           per-user claim counter
--   KEYS[3] quan:tpl:{<templateId>}:req:<userId>:<reqId>    optional: the claim's marker
--   KEYS[4] quan:tpl:{<templateId>}:resv                    optional: the open reservations;
--           ARGV[1] (the claim's member) leaves it whatever else happens
--   KEYS[5] quan:tpl:{<templateId>}:resv:who                optional (with KEYS[4]): and its
--           entry by user and owner ("<ARGV[1]>@<owner>") leaves this one
-- With KEYS[3] the give-back happens at most once per claim: only the call that deletes the
-- marker gives back, so a retried compensation (redelivery, crash) never gives back twice.
-- Returns the new stock; -1 when the hash (or its stock field) is gone: then the stock is not
-- touched, because HINCRBY would create a partial hash without dates or TTL, and the
-- next cache load takes the stock from the database anyway; -2 when the marker was already
-- gone (given back before, or never claimed): nothing is touched.

if KEYS[4] then
    redis.call('ZREM', KEYS[4], ARGV[1])
    if KEYS[5] then
        local p = ARGV[1] .. '@'
        for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[5], '[' .. p, '[' .. p .. '\255')) do
            redis.call('ZREM', KEYS[5], m)
        end
    end
end
if KEYS[3] and redis.call('DEL', KEYS[3]) == 0 then
    return -2
end
local count = tonumber(redis.call('GET', KEYS[2]))
if count and count > 0 then
    redis.call('DECR', KEYS[2]) -- keeps the counter's TTL
end
if redis.call('HEXISTS', KEYS[1], 'stock') == 0 then
    return -1
end
return redis.call('HINCRBY', KEYS[1], 'stock', 1)
