-- template_status_set.lua: sets the status field of a template cache hash only if the hash
-- exists (never a partial hash). Idempotent.
--   KEYS[1] quan:tpl:{<templateId>}
--   ARGV[1] the status (0 active, 1 ended)
-- Returns 1 when set, 0 when the hash is absent.
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
return 1
