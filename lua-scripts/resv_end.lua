-- resv_end.lua: ends the record of a reservation that is settled (its coupon row exists, or it
-- was given back by other means): the claim's member leaves the template's open reservations
-- and their index by user and owner, together, so that no user is left "in doubt" by an entry
-- the other set no longer has.
--
-- Keys (one template's slot):
--   KEYS[1] quan:tpl:{<templateId>}:resv       sorted set, member "<userId>:<reqId>"
--   KEYS[2] quan:tpl:{<templateId>}:resv:who   sorted set (score 0), member "<member>@<owner>"
-- Arguments:
--   ARGV[1] the member, "<userId>:<reqId>"
-- Returns 1 when the record was open, 0 when it was not (ended before: harmless).

local p = ARGV[1] .. '@'
for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[2], '[' .. p, '[' .. p .. '\255')) do
    redis.call('ZREM', KEYS[2], m)
end
return redis.call('ZREM', KEYS[1], ARGV[1])
