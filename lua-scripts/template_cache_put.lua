-- template_cache_put.lua: writes a whole template cache hash at once, only if it is absent.
-- A present hash holds live stock (claims in flight), so it is never overwritten from the
-- database (stock in the hash is state, not a cache); a partial hash is never created.
--   KEYS[1] quan:tpl:{<templateId>}
--   ARGV[1] expiry: epoch ms (the template's validEndTime; PEXPIREAT, absolute ms)
--   ARGV[2..] field, value, field, value, ...
-- Returns 1 when written, 0 when the hash already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
local fields = {}
for i = 2, #ARGV do
    fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return 1
