-- dist_chunk_undo.lua: gives back what dist_chunk.lua reserved for rows of a chunk that the
-- database did not take (a coupon row refused by a unique key): stock + 1 and the user's counter
-- - 1 per row, ONCE per chunk (the record's field u), however often it is called.
--   KEYS[1]   quan:tpl:{<templateId>}                        template hash (field stock)
--   KEYS[2]   quan:tpl:{<templateId>}:task:<task>:chunk:<n>  the chunk's record
--   KEYS[3..] quan:tpl:{<templateId>}:user:<userId>          the counter of each row given back
--             (a user twice in the list is given back twice)
-- Returns the number of rows given back; -1 when the record is gone (nothing touched: a
-- record outlives every run that may still need it); -2 when this chunk gave back before.
-- The stock is not touched when the hash is gone (as claim_undo.lua: the next cache load
-- takes the stock from the database).
if redis.call('EXISTS', KEYS[2]) == 0 then
    return -1
end
if redis.call('HSETNX', KEYS[2], 'u', 1) == 0 then
    return -2
end
for i = 3, #KEYS do
    local count = tonumber(redis.call('GET', KEYS[i]))
    if count and count > 0 then
        redis.call('DECR', KEYS[i]) -- keeps the counter's TTL
    end
end
local n = #KEYS - 2
if n > 0 and redis.call('HEXISTS', KEYS[1], 'stock') == 1 then
    redis.call('HINCRBY', KEYS[1], 'stock', n)
end
return n
