-- bloom_check.lua: is one id maybe in the bloom filter (common/redis/bloom.h)?
--   KEYS[1] the filter, ARGV[1] the expected header, ARGV[2..] absolute bit offsets
-- Returns 1 maybe present, 0 surely absent, -1 no filter (unknown), -2 a filter with other
-- parameters (unknown). Never writes (an id is added only when its row exists, never on a miss).
local h = redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1)
if h == '' then
    return -1
elseif h ~= ARGV[1] then
    return -2
end
for i = 2, #ARGV do
    if redis.call('GETBIT', KEYS[1], ARGV[i]) == 0 then
        return 0
    end
end
return 1
