-- dist_chunk.lua: the Redis half of one chunk of a distribution task, in ONE call: for each row
-- of the chunk (in sheet order), a duplicate of a user already seen in the task's file, the
-- per-user limit (the user's count in the template's users hash, the one claim.lua keeps, so
-- claims and distribution count together), the stock, and the reservation of what passes
-- (stock - 1, count + 1). The outcomes are stored under the chunk's record, so the same chunk
-- run again (a crash, a second run) gets them back and reserves nothing again.
--
-- Keys (all carry the hash tag {<templateId>}: one Redis Cluster slot):
--   KEYS[1]   quan:tpl:{<templateId>}                        template hash (template.h fields)
--   KEYS[2]   quan:tpl:{<templateId>}:task:<task>:chunk:<n>  the chunk's record (hash):
--             o = the outcomes, u = given back (dist_chunk_undo.lua), c = committed (closed)
--   KEYS[3]   quan:tpl:{<templateId>}:task:<task>:seen       the user ids of the task so far
--   KEYS[4]   quan:tpl:{<templateId>}:users                  the users hash (keys.h): field
--             "<userId>" = the user's count on the template (claim markers are not touched)
-- Arguments:
--   ARGV[1]   now (epoch ms)
--   ARGV[2]   how long the record and the set are kept (ms; refreshed every chunk)
--   ARGV[3]   "run"; "peek": only replay a chunk reserved before, reserve nothing; "again":
--             run, without the seen set (neither read nor added to: the rows are those an
--             earlier pass of the chunk found out of stock, checked against it then, run again
--             once stock came to this bucket); "out": reserve nothing, every row "out of stock
--             for good" (-6: every bucket of the template was found empty, bucket.h)
--   ARGV[4]   limitPerPerson of the template (the same rule as claims)
--   ARGV[5..] each row's user id (decimal text: also its field in KEYS[4]), in sheet order
-- Returns an array (chunk.h mirrors the codes), the outcomes as ONE string "o1,o2,...,on" (one
-- reply object instead of one per row; the record holds the same text):
--   {0, outcomes}  reserved now
--   {1, outcomes}  replayed: reserved by an earlier call, nothing done now
--   {2}            peek, and the chunk was never reserved: nothing done
--   {3}            cache miss (hash missing or partial): load the template, call again
--   {4}            the chunk was committed and its record closed: nothing to do
-- with one outcome per row: n >= 1 issued, n being the user's receive count (claim.lua's
-- count: the n-th coupon of this template the user gets, by any path); -1 duplicate in the
-- file; -2 per-user limit reached; -3 out of stock; -4 template ended (terminated, or now is
-- past validEndTime: every row of the chunk); -6 out of stock for good (mode "out" only).
--
-- A template of several stock buckets (bucket.h) runs one call per bucket, on the bucket's
-- keys (KEYS[1] its hash, KEYS[4] its users hash, KEYS[2] and KEYS[3] in its slot) with the
-- rows of the users it is home to, and another call on a record of its own per pass of the
-- rows one pass found out of stock ("again" or "out").
--
-- Cost: the counts are read with one HMGET and the seen set with one SMISMEMBER, and the new
-- counts written with one HSET (per slice of UNPACK values: Lua's stack is bounded). A user
-- passes at most once a call (the seen set and the chunk's own duplicates), so its new count
-- is the one read + 1. The users hash expires at the template's end at the earliest; a
-- claim's marker may keep it longer, so the expiry is only ever pushed out, as claim.lua does.

local UNPACK = 4000
local now, ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local mode = ARGV[3]
if not now or not ttl or not limit or
    (mode ~= 'run' and mode ~= 'peek' and mode ~= 'again' and mode ~= 'out') then
    return redis.error_reply('ERR dist_chunk.lua: bad arguments (now, ttl, mode, limit)')
end
local rec = redis.call('HMGET', KEYS[2], 'o', 'c')
if rec[2] then
    return {4}
end
if rec[1] then
    return {1, rec[1]}
end
if mode == 'peek' then
    return {2}
end
local n = #ARGV - 4
if mode == 'out' then
    local codes = {}
    for i = 1, n do
        codes[i] = '-6'
    end
    local text = table.concat(codes, ',')
    redis.call('HSET', KEYS[2], 'o', text)
    redis.call('PEXPIRE', KEYS[2], ttl)
    return {0, text}
end
local again = mode == 'again'

local f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validEndTime')
local stock, status, end_ms = tonumber(f[1]), tonumber(f[2]), tonumber(f[3])
if not stock or not status or not end_ms then
    return {3}
end

-- The outcomes are kept as strings: Lua turns a number into text through printf's %.14g,
-- which costs more than the rest of a row; the few distinct values are converted once each.
local text_of = {}
local function code(v)
    local t = text_of[v]
    if not t then
        t = tostring(v)
        text_of[v] = t
    end
    return t
end

local codes, taken = {}, 0
if status ~= 0 or now > end_ms then
    for i = 1, n do
        codes[i] = '-4'
    end
else
    local counts, seen, fresh, here, set = {}, {}, {}, {}, {}
    for a = 1, n, UNPACK do
        local b = math.min(a + UNPACK - 1, n)
        local c = redis.call('HMGET', KEYS[4], unpack(ARGV, 4 + a, 4 + b))
        local s = not again and redis.call('SMISMEMBER', KEYS[3], unpack(ARGV, 4 + a, 4 + b))
        for i = a, b do
            counts[i] = tonumber(c[i - a + 1]) or 0
            seen[i] = s and s[i - a + 1] == 1
        end
    end
    for i = 1, n do
        local user = ARGV[4 + i]
        if seen[i] or here[user] then
            codes[i] = '-1'
        else
            here[user] = true
            fresh[#fresh + 1] = user
            if counts[i] >= limit then
                codes[i] = '-2'
            elseif stock - taken <= 0 then
                codes[i] = '-3'
            else
                taken = taken + 1
                -- the new count as text, for the outcome and the field alike (the reason above)
                codes[i] = code(counts[i] + 1)
                set[#set + 1] = user
                set[#set + 1] = codes[i]
            end
        end
    end
    for a = 1, again and 0 or #fresh, UNPACK do
        redis.call('SADD', KEYS[3], unpack(fresh, a, math.min(a + UNPACK - 1, #fresh)))
    end
    -- UNPACK values a slice: field and value pairs, UNPACK being even, never split
    for a = 1, #set, UNPACK do
        redis.call('HSET', KEYS[4], unpack(set, a, math.min(a + UNPACK - 1, #set)))
    end
    -- at least until the template's end (passed as the stored text, not the number), as
    -- claim.lua keeps it; a later expiry (a recent claim's marker) stays
    if taken > 0 and redis.call('PEXPIRETIME', KEYS[4]) < end_ms then
        redis.call('PEXPIREAT', KEYS[4], f[3])
    end
end
if taken > 0 then
    redis.call('HINCRBY', KEYS[1], 'stock', -taken)
end
local text = table.concat(codes, ',')
redis.call('HSET', KEYS[2], 'o', text)
redis.call('PEXPIRE', KEYS[2], ttl)
if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('PEXPIRE', KEYS[3], ttl)
end
return {0, text}
