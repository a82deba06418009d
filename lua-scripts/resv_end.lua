-- resv_end.lua: ends the records of reservations that are settled (their coupon rows exist, or
-- they were given back by other means): each claim's member leaves the template's open
-- reservations, and its user's open count goes down with it, together, so that no user is
-- left "in doubt" by a count the set no longer backs. One call ends any number of one
-- template's records (the MQ consumer ends a batch's in one call per template instead of one
-- per claim).
--
-- Keys (one template's slot):
--   KEYS[1] quan:tpl:{<templateId>}:resv       sorted set, member "<userId>:<reqId>"
--   KEYS[2] quan:tpl:{<templateId>}:users      hash: field "<userId>#" = the user's open count
-- Arguments:
--   ARGV[1..n] the members, "<userId>:<reqId>"
-- Returns how many of the records were open (1 or 0 for one member; 0: ended before, harmless).
-- The marker fields stay: a retried request id still finds its claim (claim.lua).

local ended = 0
for _, member in ipairs(ARGV) do
    if redis.call('ZREM', KEYS[1], member) == 1 then
        ended = ended + 1
        local user = string.match(member, '^(%d+):')
        local field = user and user .. '#'
        -- Only a count that is there goes down: a hash that expired is not made again.
        local open = field and tonumber(redis.call('HGET', KEYS[2], field))
        if open and open > 1 then
            redis.call('HINCRBY', KEYS[2], field, -1)
        elseif open then
            redis.call('HDEL', KEYS[2], field)
        end
    end
end
return ended
