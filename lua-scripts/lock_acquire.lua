-- lock_acquire.lua: takes the lock if free (common/redis/lock.h, owner-token variant).
--   KEYS[1] lock key, ARGV[1] owner token (random, per acquisition), ARGV[2] lease in ms.
-- Returns 1 if acquired, 0 if another owner holds it. Idempotent for one token: if an earlier
-- attempt succeeded but its reply was lost (timeout), the retry still reports 1.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
