-- lock_release.lua: compare-and-delete, so a holder whose lease ran out never deletes the
-- lock that another owner has taken since. Nothing in it is about locks: the engine also uses
-- it to remove a pending claim marker only while it still names the same attempt.
--   KEYS[1] lock key, ARGV[1] owner token (any key, the value it must still hold).
-- Returns 1 if deleted, 0 if not ours (or already gone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
