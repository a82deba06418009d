-- claim_undo.lua: gives back a successful claim whose database write failed or was refused
-- (no reservation is left behind without a coupon row): stock + 1 and the user's count - 1.
--
-- Keys (same layout and hash tag as claim.lua):
--   KEYS[1] quan:tpl:{<templateId>}            template hash (field stock)
--   KEYS[2] quan:tpl:{<templateId>}:users      the users' counts and the claims' markers
--   KEYS[3] quan:tpl:{<templateId>}:resv       optional: the open reservations; the claim's
--           member leaves it whatever else happens (its request id may stay in the user's list
--           "<userId>#": claim.lua drops the ids the set no longer holds when it reads them)
-- Arguments:
--   ARGV[1] the user id; ARGV[2] the claim's member "<userId>:<reqId>", also its marker's field
--   ("": no marker, the give-back is not guarded)
--   ARGV[3] optional: the time (ms) of the attempt being given back, as its marker records it
--   ("<count>:<time>[:<owner>]"); "" or absent: whichever attempt the marker is
-- With a marker the give-back happens at most once per claim: only the call that deletes the
-- marker gives back, so a retried compensation (redelivery, crash) never gives back twice. With
-- the attempt's time it gives back only that attempt: a request id retried after its first
-- attempt was given up has a new marker under the same field, the retry's, which a late
-- compensation of the first attempt must leave alone.
-- Returns the new stock; -1 when the hash (or its stock field) is gone: then the stock is not
-- touched, because HINCRBY would create a partial hash without dates or TTL, and the
-- next cache load takes the stock from the database anyway; -2 when the marker was already
-- gone (given back before, or never claimed): nothing is touched; -3 when the marker is another
-- attempt's: nothing is touched. A give-back raises the hash's generation ("gen") with its stock,
-- as every script that raises a stock bucket's stock must (bucket.h: the sold-out verdict).

local user, member, attempt = ARGV[1], ARGV[2], ARGV[3] or ''
if member ~= '' and attempt ~= '' then
    local marker = redis.call('HGET', KEYS[2], member)
    local time = marker and string.match(marker, '^[^:]*:([^:]*)') -- nil: kept no time
    if time and time ~= attempt then
        return -3
    end
end
if KEYS[3] and member ~= '' then
    redis.call('ZREM', KEYS[3], member)
end
if member ~= '' and redis.call('HDEL', KEYS[2], member) == 0 then
    return -2
end
local count = tonumber(redis.call('HGET', KEYS[2], user))
if count and count > 0 then
    redis.call('HINCRBY', KEYS[2], user, -1) -- the hash keeps its expiry
end
if redis.call('HEXISTS', KEYS[1], 'stock') == 0 then
    return -1
end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', 1)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
return stock
