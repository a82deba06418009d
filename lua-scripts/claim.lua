-- claim.lua: the claim gate of one user on one coupon template, in ONE Redis round trip
-- (it replaces the Java platform's stock_decrement_and_save_user_receive.lua). Everything it
-- needs is read from the template hash, so the caller passes no template data: its fields
-- limitPerPerson and validityHours (template.h), or, in a hash written before those existed,
-- receiveRule's limitPerPerson and consumeRule's validityPeriod.
--
-- Keys (all carry the hash tag {<templateId>}, so they live in one Redis Cluster slot):
--   KEYS[1] quan:tpl:{<templateId>}            hash (template.h fields)
--   KEYS[2] quan:tpl:{<templateId>}:users      hash: field "<userId>" = the user's count;
--           field "<userId>:<reqId>" = one claim's marker, "<count>:<now>[:<owner>]" (keys.h);
--           field "<userId>#" = the request ids of the user's reservations recorded in KEYS[3],
--           ",<reqId>,<reqId>..." (absent: none); those settled since are still listed until a
--           claim of the user at the limit looks (a settle writes nothing here).
--           The marker makes a retried request id claim at most once and claim_undo
--           exactly-once; the reservation's time names this attempt in the database, and the
--           owner tells the sweeper whose it is
--   KEYS[3] quan:tpl:{<templateId>}:resv       optional: the reservations not yet settled (no
--           coupon row, no give-back yet), member "<userId>:<reqId>", score now; whoever settles
--           one removes it (a ZREM, nothing else), and the engine's sweeper settles those of a
--           process that died
-- Arguments:
--   ARGV[1] the engine process that reserves ("<instance>/<run>", resv.h), written into the
--   markers of the claims it records in KEYS[3]; "" for none
--   then four per claim: now (epoch ms); the shop number the client named, checked against the
--   hash's ("" or "0" skips it); the user id; the claim's member "<userId>:<reqId>" ("": no
--   marker and no reservation record)
--
-- More claims of the same template in one call (the engine gathers those of a loop turn: one
-- script run instead of one each, the template read once) add four arguments each. The claims
-- are taken in order, each exactly as if called alone, and the answer is then an array of
-- their answers, in order. The writes of all of them are made at the end of the call, one
-- command each (the stock's HINCRBY, the records' ZADD, the users hash's HDEL and HSET), the
-- expiries at most once; until then the call's later claims read the earlier ones' writes
-- here (written, recorded).
--
-- A refusal is final to every client, so the script refuses only on a settled fact: while the
-- template's stock is gone but some of it is held by reservations not settled yet, or while
-- the user is at the limit only by counting such reservations of their own, it answers "in
-- doubt" (8, 9), which the engine answers with a retryable 429.
-- Returns an array, never a bit-packed integer (no shift constants to get out of step). The
-- names are those of enum claimgate_result in common/coupon/claimgate.h, which mirrors this list:
--   {0, n, h, e}  CLAIMGATE_OK              success: stock - 1, counter + 1; n = the new count
--                                           (receive_count, from 1, as every entry point
--                                           counts), h = the coupon's validityPeriod in hours,
--                                           e = the template's end (ms)
--   {1, n}        CLAIMGATE_SOLD_OUT        stock exhausted (n = the user's current count)
--   {2, n}        CLAIMGATE_LIMIT_REACHED   per-user limit reached
--   {3, n}        CLAIMGATE_NOT_ACTIVE      template not active (status ~= 0: terminated, ended)
--   {4, n}        CLAIMGATE_OUTSIDE_WINDOW  outside the claim window (now < validStartTime or
--                                           now > validEndTime)
--   {5, 0}        CLAIMGATE_CACHE_MISS      cache missing or partial: load the template, then
--                                           call again (never an error)
--   {6, 0}        CLAIMGATE_OTHER_SHOP      the template belongs to another shop: "not found"
--   {7, n, t}     CLAIMGATE_REPEATED        this request id already claimed; n = the count it got,
--                                           t = the time (ms) of that reservation (0: unknown)
--   {8, n}        CLAIMGATE_STOCK_IN_DOUBT  no stock left, but reservations not yet settled hold
--                                           some: it may come back
--   {9, n}        CLAIMGATE_LIMIT_IN_DOUBT  the limit is reached only with the user's own
--                                           reservations not yet settled

local f, limit, hours -- the template's fields and rules, read when a claim first needs them
local users_expire = 0 -- the latest expiry the users' hash needs (written once, at the end)
local set_expire = 0 -- the same for the reservation set
local owner = ARGV[1] ~= '' and ':' .. ARGV[1] or '' -- the markers' suffix

-- This call's writes, made at its end.
local taken = 0 -- stock units taken
local records = {} -- the ZADD's arguments: time, member, ...
local recorded = {} -- member -> true: recorded by this call
local written = {} -- KEYS[2]'s fields this call wrote: field -> value (false: deleted)
local order = {} -- those fields, in the order first written

local function put(field, value)
    if written[field] == nil then
        order[#order + 1] = field
    end
    written[field] = value
end

-- A field of KEYS[2] as this call left it: what Redis holds (stored), unless the call wrote it.
local function read(field, stored)
    local w = written[field]
    if w == nil then
        return stored
    end
    return w or nil
end

-- How many of the user's reservations listed in "<userId>#" are still open (members of KEYS[3]),
-- leaving only those listed. A list not in the format (",<reqId>...") is found again from the
-- set: a scan of the user's members, once.
local function still_open(user, list)
    local field, members = user .. '#', {}
    if string.sub(list, 1, 1) == ',' then
        for id in string.gmatch(list, '[^,]+') do
            members[#members + 1] = user .. ':' .. id
        end
    else
        local cursor = '0'
        repeat
            local page = redis.call('ZSCAN', KEYS[3], cursor, 'MATCH', user .. ':*', 'COUNT', 1000)
            cursor = page[1]
            for i = 1, #page[2], 2 do
                members[#members + 1] = page[2][i]
            end
        until cursor == '0'
        local found = {}
        for _, m in ipairs(members) do
            found[m] = true
        end
        for m in pairs(recorded) do -- and the call's own, not in the set yet
            if not found[m] and string.sub(m, 1, #user + 1) == user .. ':' then
                members[#members + 1] = m
            end
        end
    end
    local open = {}
    if #members > 0 then
        local scores = redis.call('ZMSCORE', KEYS[3], unpack(members))
        for i, m in ipairs(members) do
            if scores[i] or recorded[m] then
                open[#open + 1] = ',' .. string.sub(m, #user + 2)
            end
        end
    end
    local kept = table.concat(open)
    if #open == 0 then
        put(field, false)
    elseif kept ~= list then
        put(field, kept)
    end
    return #open, kept
end

-- The rules are JSON text in the hash (read with the fields); a malformed rule falls back to the
-- API's defaults.
local function rule(text, name, default)
    local ok, obj = pcall(cjson.decode, text or '{}')
    local v = ok and type(obj) == 'table' and tonumber(obj[name]) or nil
    if not v or v < 1 then
        return default
    end
    return math.floor(v)
end

-- One claim: its now (the text it came as), shop, user and member.
local function claim(now_text, shop, user, member)
    local now = tonumber(now_text)
    if not now or not string.match(user or '', '^%d+$') then
        return redis.error_reply('ERR claim.lua: bad arguments (now, shopNumber, user, member)')
    end
    if member == '' then
        member = nil
    end
    local count, done, open
    if member then
        local v = redis.call('HMGET', KEYS[2], user, member, user .. '#')
        count, done, open = read(user, v[1]), read(member, v[2]), read(user .. '#', v[3])
        if done then
            local n, t = string.match(done, '^(%d+):?(%d*)')
            return {7, tonumber(n) or 0, tonumber(t) or 0}
        end
    end
    if not f then
        f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime',
                       'shopNumber', 'limitPerPerson', 'validityHours')
        f[1], f[2], f[3] = tonumber(f[1]), tonumber(f[2]), tonumber(f[3])
        f.end_ms = tonumber(f[4])
        if f[1] and f[2] and f[3] and f.end_ms then
            limit, hours = tonumber(f[6]), tonumber(f[7])
            if not limit or limit < 1 or not hours or hours < 1 then
                local r = redis.call('HMGET', KEYS[1], 'receiveRule', 'consumeRule')
                limit, hours = rule(r[1], 'limitPerPerson', 1), rule(r[2], 'validityPeriod', 24)
            end
        end
    end
    if not limit then
        return {5, 0}
    end
    if shop and shop ~= '' and shop ~= '0' and shop ~= f[5] then
        return {6, 0}
    end

    if not member then
        count = read(user, redis.call('HGET', KEYS[2], user))
    end
    count = tonumber(count) or 0
    if f[2] ~= 0 then
        return {3, count}
    end
    local end_ms = f.end_ms
    if now < f[3] or now > end_ms then
        return {4, count}
    end
    if f[1] <= 0 then
        if KEYS[3] and (#records > 0 or redis.call('ZCARD', KEYS[3]) > 0) then
            return {8, count}
        end
        return {1, count}
    end
    if count >= limit then
        if KEYS[3] and member and open and count - still_open(user, open) < limit then
            return {9, count}
        end
        return {2, count}
    end

    -- Times go to Redis as the strings they came in (the claim's now, the hash's
    -- validEndTime), and the count as %d, not as Lua numbers: a number is formatted with
    -- printf's floating point, a measurable share of the script.
    taken = taken + 1
    f[1] = f[1] - 1
    count = count + 1
    local n = string.format('%d', count)
    users_expire = math.max(users_expire, end_ms)
    put(user, n)
    if member then
        -- Kept at least an hour, so a claim near the end can still be given back exactly once.
        local keep = math.max(end_ms, now + 3600000)
        users_expire = math.max(users_expire, keep)
        if KEYS[3] then
            -- The record, and its request id in the user's list (once: an earlier attempt of
            -- this request id whose record is still there listed it).
            records[#records + 1] = now_text
            records[#records + 1] = member
            recorded[member] = true
            -- The set lives a day past its last reservation's keep.
            set_expire = math.max(set_expire, keep + 86400000)
            local list, id = open or '', string.sub(member, #user + 2)
            -- A long list (a high limit) drops its settled ids before it grows.
            if #list > 256 then
                local _
                _, list = still_open(user, list)
            end
            if not string.find(list .. ',', ',' .. id .. ',', 1, true) then
                list = list .. ',' .. id
            end
            put(member, n .. ':' .. now_text .. owner)
            put(user .. '#', list)
        else
            put(member, n .. ':' .. now_text)
        end
    end
    return {0, count, hours, end_ms}
end

-- cmd KEYS[k] with args, in slices unpack can take (pairs are never split).
local function send(cmd, key, args)
    for i = 1, #args, 1000 do
        redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
    end
end

-- The call's writes. The stock first: Redis does not roll a script back, so a script stopped
-- by an error between them must not leave counts without their stock taken (an oversell); the
-- other way round it only holds units back until the stock is reconciled with the databases
-- (reconcile.h).
local function write()
    if taken > 0 then
        redis.call('HINCRBY', KEYS[1], 'stock', -taken)
    end
    if #records > 0 then
        send('ZADD', KEYS[3], records)
    end
    local sets, dels = {}, {}
    for _, field in ipairs(order) do
        local v = written[field]
        if v then
            sets[#sets + 1] = field
            sets[#sets + 1] = v
        else
            dels[#dels + 1] = field
        end
    end
    if #dels > 0 then
        send('HDEL', KEYS[2], dels)
    end
    if #sets > 0 then
        send('HSET', KEYS[2], sets)
    end
end

-- Those keeps are the same instant for most claims of a template (its end), so an expiry is
-- written only when it moves: a read instead of a write (no append-only file entry) per call.
local function keep(key, at)
    if at > 0 and key and redis.call('PEXPIRETIME', key) < at then
        redis.call('PEXPIREAT', key, string.format('%d', at))
    end
end

if #ARGV < 5 or (#ARGV - 1) % 4 ~= 0 then
    return redis.error_reply('ERR claim.lua: an owner, then 4 arguments a claim')
end
local out
if #ARGV == 5 then
    out = claim(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
else
    out = {}
    for i = 2, #ARGV, 4 do
        out[#out + 1] = claim(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    end
end
write()
keep(KEYS[2], users_expire)
keep(KEYS[3], set_expire)
return out
