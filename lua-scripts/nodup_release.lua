-- nodup_release.lua: the end of a guarded request (common/service/nodup.h).
--   KEYS[1] quan:nodup:<path>:<user>:<digest>
--   ARGV[1] the request's token: nothing happens unless the key still holds it
--   ARGV[2] ms: 0 = delete the key (the request failed), else keep it this long (PEXPIRE)
-- Returns 1 when done, 0 when the key is gone or another request's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if tonumber(ARGV[2]) == 0 then
    redis.call('DEL', KEYS[1])
else
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
