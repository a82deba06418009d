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

-- Which of them are open, in one read, then one ZREM of those (in slices unpack can hold);
-- only their users' counts go down.
local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
local open = {}
for i, member in ipairs(ARGV) do
    if scores[i] then
        open[#open + 1] = member
    end
end
for i = 1, #open, 1000 do
    redis.call('ZREM', KEYS[1], unpack(open, i, math.min(i + 999, #open)))
end
for _, member in ipairs(open) do
    local user = string.match(member, '^(%d+):')
    local field = user and user .. '#'
    -- Only a count that is there goes down: a hash that expired is not made again.
    local n = field and tonumber(redis.call('HGET', KEYS[2], field))
    if n and n > 1 then
        redis.call('HINCRBY', KEYS[2], field, -1)
    elseif n then
        redis.call('HDEL', KEYS[2], field)
    end
end
return #open
