-- claim_undo.lua: gives back a successful claim whose DB write failed (D5).
--
-- Keys (same layout and hash tag as claim.lua):
--   KEYS[1] quan:tpl:{<templateId>}               template hash (field stock)
--   KEYS[2] quan:tpl:{<templateId>}:user:<userId>  per-user claim counter
-- Returns the new stock, or -1 when the hash (or its stock field) is gone: then nothing is
-- touched, because HINCRBY would create a partial hash without dates or TTL (D16); the next
-- cache load takes the stock from the DB anyway.

if redis.call('HEXISTS', KEYS[1], 'stock') == 0 then
    return -1
end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', 1)
local count = tonumber(redis.call('GET', KEYS[2]))
if count and count > 0 then
    redis.call('DECR', KEYS[2]) -- keeps the counter's TTL
end
return stock
