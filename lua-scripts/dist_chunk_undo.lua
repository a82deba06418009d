-- dist_chunk_undo.lua: gives back what dist_chunk.lua reserved for rows of a chunk that the
-- database did not take (a coupon row refused by a unique key): stock + 1 and the user's count
-- - 1 per row, ONCE per chunk (the record's field u), however often it is called.
--   KEYS[1]   quan:tpl:{<templateId>}                        template hash (field stock)
--   KEYS[2]   quan:tpl:{<templateId>}:task:<task>:chunk:<n>  the chunk's record
--   KEYS[3]   quan:tpl:{<templateId>}:users                  the users hash (keys.h): field
--             "<userId>" = the user's count
--   ARGV[1..] the user id of each row given back (a user twice in the list is given back
--             twice; a count never goes below 0)
-- Returns the number of rows given back; -1 when the record is gone (nothing touched: a
-- record outlives every run that may still need it); -2 when this chunk gave back before.
-- The stock is not touched when the hash is gone (as claim_undo.lua: the next cache load
-- takes the stock from the database). Giving stock back raises the hash's generation ("gen"), as
-- every script that raises a stock bucket's stock must (bucket.h: the sold-out verdict).
if redis.call('EXISTS', KEYS[2]) == 0 then
    return -1
end
if redis.call('HSETNX', KEYS[2], 'u', 1) == 0 then
    return -2
end
for i = 1, #ARGV do
    local count = tonumber(redis.call('HGET', KEYS[3], ARGV[i]))
    if count and count > 0 then
        redis.call('HINCRBY', KEYS[3], ARGV[i], -1) -- the hash keeps its expiry
    end
end
local n = #ARGV
if n > 0 and redis.call('HEXISTS', KEYS[1], 'stock') == 1 then
    redis.call('HINCRBY', KEYS[1], 'stock', n)
    redis.call('HINCRBY', KEYS[1], 'gen', 1)
end
return n
