-- resv_end.lua: ends the records of reservations that are settled (their coupon rows exist, or
-- they were given back by other means): each claim's member leaves the template's open
-- reservations and their index by user and owner, together, so that no user is left "in doubt"
-- by an entry the other set no longer has. One call ends any number of one template's records
-- (the MQ consumer ends a batch's in one call per template instead of one per claim).
--
-- Keys (one template's slot):
--   KEYS[1] quan:tpl:{<templateId>}:resv       sorted set, member "<userId>:<reqId>"
--   KEYS[2] quan:tpl:{<templateId>}:resv:who   sorted set (score 0), member "<member>@<owner>"
-- Arguments:
--   ARGV[1..n] the members, "<userId>:<reqId>"
-- Returns how many of the records were open (1 or 0 for one member; 0: ended before, harmless).

local who = {}
for _, a in ipairs(ARGV) do
    local p = a .. '@'
    for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[2], '[' .. p, '[' .. p .. '\255')) do
        who[#who + 1] = m
    end
end
-- ZREM with many members at once, in slices that unpack can hold.
local function zrem(key, list)
    local n = 0
    for i = 1, #list, 1000 do
        n = n + redis.call('ZREM', key, unpack(list, i, math.min(i + 999, #list)))
    end
    return n
end
zrem(KEYS[2], who)
return zrem(KEYS[1], ARGV)
