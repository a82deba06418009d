-- resv_prune.lua: drops one template from the index of templates with reservations
-- (quan:resv:tpls) once it has been quiet, for the engine's reservation sweeper.
--
-- Keys:
--   KEYS[1] quan:resv:tpls   sorted set, member "<templateId>:<shopNumber>", score = the last
--                            time an engine said it reserves on that template (ms)
-- Arguments:
--   ARGV[1] the member; ARGV[2] the cutoff (ms)
-- Removes the member only if its score is still older than the cutoff: an engine that touched
-- it since (it does before reserving, at least once a minute) keeps it. The caller has seen
-- the template's reservation set empty. Returns 1 when removed, else 0.

local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if score and score < tonumber(ARGV[2]) then
    return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
