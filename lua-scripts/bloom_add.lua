-- bloom_add.lua: sets the bits of one id in a bloom filter bitmap (common/redis/bloom.h).
--   KEYS[1] the filter (header + bits)
--   ARGV[1] the header naming the filter's parameters (written if the key is new)
--   ARGV[2..] absolute bit offsets, computed by bloom_positions
-- Returns 1 when set, -2 when the key holds a filter with other parameters (nothing written).
local h = redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1)
if h == '' then
    redis.call('SETRANGE', KEYS[1], 0, ARGV[1])
elseif h ~= ARGV[1] then
    return -2
end
for i = 2, #ARGV do
    redis.call('SETBIT', KEYS[1], ARGV[i], 1)
end
return 1
