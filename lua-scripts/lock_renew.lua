-- lock_renew.lua: the watchdog's lease extension, only while we still own the lock (also the
-- renewal of a snowflake worker-id lease, which is a lock on the id: common/redis/ids.c).
--   KEYS[1] lock key, ARGV[1] owner token, ARGV[2] new lease in ms.
-- Returns 1 if renewed, 0 if the lock is gone or owned by someone else (the lease ran out).
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
