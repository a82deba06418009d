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
--   ARGV[2] the number of stock buckets the caller routed by (bucket.h; "" means 1): the keys
--   are one bucket's, the users' home bucket among that many. The hash's field "buckets"
--   (absent: 1) must say the same, or nothing is written (see code 10)
--   then four per claim: now (epoch ms); the shop number the client named, checked against the
--   hash's ("" or "0" skips it); the user id; the claim's member "<userId>:<reqId>" ("": no
--   marker and no reservation record)
--
-- More claims of the same template in one call (the engine gathers those of a loop turn: one
-- script run instead of one each, the template read once) add four arguments each. The claims
-- are taken in order, each exactly as if called alone, and the answer is then an array of
-- their answers, in order. Every claim's fields of the users hash are read by one HMGET at the
-- start, and the writes of all of them are made at the end of the call, one command each (the
-- stock's HINCRBY, the records' ZADD, the users hash's HDEL and HSET), the expiries at most
-- once; in between the call's later claims read the earlier ones' writes here (sets, at,
-- records).
--
-- Both expiries are read back (PEXPIRETIME) rather than remembered in the template hash: the
-- records' set is deleted whenever its last record is settled (a ZREM) and made again, with no
-- expiry, by the next claim's ZADD, which only a read after the write can tell.
--
-- The script is written as one loop without helper functions: Redis runs a script's body anew
-- on every call, so each function it defines is a closure made, and later collected, per call,
-- which cost a third of a claim's instructions (bench/script_instr.sh). The rare paths make
-- theirs only when taken.
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
--   {10, n}       CLAIMGATE_WRONG_BUCKETS   the template has n buckets, not ARGV[2]: every
--                                           claim of the call gets it, nothing is written;
--                                           route again by n

local ARGV, call, tonumber, match, sub, find, format = ARGV, redis.call, tonumber, string.match,
                                                     string.sub, string.find, string.format
local argc = #ARGV
if argc < 6 or (argc - 2) % 4 ~= 0 then
    return redis.error_reply('ERR claim.lua: an owner, the buckets, then 4 arguments a claim')
end
local tpl_key, users_key, set_key = KEYS[1], KEYS[2], KEYS[3]
local owner = ARGV[1] -- the markers' suffix, after a ':' ("": none)
local routed = ARGV[2] ~= '' and ARGV[2] or '1' -- the caller's buckets, as text
local wrong -- the hash's buckets, when they are not the caller's: nothing is written

-- The template's fields and rules, read when a claim first needs them.
local loaded, stock, status, valid_start, end_ms, shop_number, limit, hours = false
local users_expire = 0 -- the latest expiry the users' hash needs (written once, at the end)
local set_expire = 0 -- the same for the reservation set

-- This call's writes, made at its end; the tables are made at the first write.
local taken = 0 -- stock units taken
local records, nrec = nil, 0 -- the ZADD's arguments: time, member, ...; how many
local sets -- the HSET's arguments: field, value, ... (value false: the field is deleted)
local at -- field -> its index in sets: the call's own writes, which its later claims read
local deleted = false -- some value in sets is false
local still_open -- made when a claim first needs it (below)

-- Every claim's fields of users_key, read at once: the count "<userId>", and with a member its
-- marker and its list "<userId>#" (fields[p..p+2] and got[p..p+2], p moving through the claims
-- in order). One HMGET a call, not one a claim: a redis.call costs as much as a claim's own Lua
-- work (bench/script_instr.sh). A claim reads its fields here unless an earlier claim of the
-- call wrote them (at, below).
local fields, got, list1 -- list1: the one claim's list field (a call of one: no fields table)
if argc == 6 then
    if ARGV[6] ~= '' then
        list1 = ARGV[5] .. '#'
        got = call('HMGET', users_key, ARGV[5], ARGV[6], list1)
    else
        got = call('HMGET', users_key, ARGV[5])
    end
else
    -- (the tables of a call are made with room for 12 claims, the engine's usual call: a
    -- table grown a slot at a time reallocates at each power of two)
    fields = {
        nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
        nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
        nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
    }
    local nf = 0
    for i = 3, argc, 4 do
        local user, member = ARGV[i + 2], ARGV[i + 3]
        if member ~= '' then
            fields[nf + 1], fields[nf + 2], fields[nf + 3] = user, member, user .. '#'
            nf = nf + 3
        else
            nf = nf + 1
            fields[nf] = user
        end
    end
    if nf <= 999 then
        got = call('HMGET', users_key, unpack(fields))
    else -- in slices unpack can take
        got = {}
        for a = 1, nf, 999 do
            local v = call('HMGET', users_key, unpack(fields, a, math.min(a + 998, nf)))
            for k = 1, #v do -- (an absent field is false, not nil: no holes)
                got[a + k - 1] = v[k]
            end
        end
    end
end
local p = 1 -- the current claim's first field in fields and got
local last_text, last_now -- the previous claim's time, as text and as a number

local out, answer, nout = nil, nil, 0
if argc > 6 then
    out = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
end
for i = 3, argc, 4 do
    local now_text, shop, user, member = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    -- A field of users_key as this call left it: what Redis held, unless the call wrote it
    -- (sets[at[field] + 1]; false when it deleted it).
    local count, done, open, list_field, w = got[p]
    if member == '' then
        member = nil
        p = p + 1
    else
        done, open, list_field = got[p + 1], got[p + 2], list1 or fields[p + 2]
        p = p + 3
    end
    repeat -- one claim: each `break` leaves with its answer
        -- (tonumber reads a string twice: claims of one loop turn mostly share their time)
        local now = last_now
        if now_text ~= last_text then
            now = tonumber(now_text)
            last_text, last_now = now_text, now
        end
        if not now or not find(user, '^%d+$') then
            answer = redis.error_reply('ERR claim.lua: bad arguments (now, shopNumber, user, member)')
            break
        end
        if at then
            w = at[user]
            if w then count = sets[w + 1] end
            if member then
                w = at[member]
                if w then done = sets[w + 1] end
                w = at[list_field]
                if w then open = sets[w + 1] end
            end
        end
        if done then
            local n, t = match(done, '^(%d+):?(%d*)')
            answer = {7, tonumber(n) or 0, tonumber(t) or 0}
            break
        end
        if not loaded then
            loaded = true
            local f = call('HMGET', tpl_key, 'stock', 'status', 'validStartTime',
                                 'validEndTime', 'shopNumber', 'limitPerPerson', 'validityHours',
                                 'buckets')
            -- (the usual texts of status and limit taken as they are: tonumber costs two strtods)
            stock, valid_start, end_ms = tonumber(f[1]), tonumber(f[3]), tonumber(f[4])
            status = f[2] == '0' and 0 or tonumber(f[2])
            shop_number = f[5]
            -- compared as text: no number made for the common case (both "1" or absent); only
            -- in a hash that holds a template (its status): a missing one is "not cached" below,
            -- whatever the caller routed by
            if f[2] and (f[8] or '1') ~= routed and tonumber(f[8] or 1) ~= tonumber(routed) then
                wrong = tonumber(f[8]) or 1
                break
            end
            if stock and status and valid_start and end_ms then
                limit, hours = f[6] == '1' and 1 or tonumber(f[6]), tonumber(f[7])
                if not limit or limit < 1 or not hours or hours < 1 then
                    -- A hash written before the numbers were: the rules' JSON (a malformed rule
                    -- falls back to the API's defaults).
                    local rule = function(text, name, default)
                        local ok, obj = pcall(cjson.decode, text or '{}')
                        local n = ok and type(obj) == 'table' and tonumber(obj[name]) or nil
                        if not n or n < 1 then
                            return default
                        end
                        return math.floor(n)
                    end
                    local r = call('HMGET', tpl_key, 'receiveRule', 'consumeRule')
                    limit, hours = rule(r[1], 'limitPerPerson', 1), rule(r[2], 'validityPeriod', 24)
                end
            end
        end
        if not limit then
            answer = {5, 0}
            break
        end
        if shop and shop ~= '' and shop ~= '0' and shop ~= shop_number then
            answer = {6, 0}
            break
        end

        count = count and tonumber(count) or 0 -- (absent: false, no call)
        if status ~= 0 then
            answer = {3, count}
            break
        end
        if now < valid_start or now > end_ms then
            answer = {4, count}
            break
        end
        if stock <= 0 then
            if set_key and (records or call('ZCARD', set_key) > 0) then
                answer = {8, count}
                break
            end
            answer = {1, count}
            break
        end

        -- How many of the user's reservations listed in "<userId>#" are still open (members
        -- of set_key), leaving only those listed. A list not in the format (",<reqId>...") is
        -- found again from the set: a scan of the user's members, once.
        if (count >= limit and set_key and member and open) or (open and #open > 256) then
            still_open = still_open or function(who, list)
                local field, members = who .. '#', {}
                if sub(list, 1, 1) == ',' then
                    for id in string.gmatch(list, '[^,]+') do
                        members[#members + 1] = who .. ':' .. id
                    end
                else
                    local cursor = '0'
                    repeat
                        local page = call('ZSCAN', set_key, cursor, 'MATCH', who .. ':*',
                                                'COUNT', 1000)
                        cursor = page[1]
                        for k = 1, #page[2], 2 do
                            members[#members + 1] = page[2][k]
                        end
                    until cursor == '0'
                    local found = {}
                    for _, m in ipairs(members) do
                        found[m] = true
                    end
                    for k = 2, #(records or {}), 2 do -- and the call's own, not in the set yet
                        local m = records[k]
                        if not found[m] and sub(m, 1, #who + 1) == who .. ':' then
                            found[m] = true
                            members[#members + 1] = m
                        end
                    end
                end
                local mine = {} -- recorded by this call: open, though not in the set yet
                for k = 2, #(records or {}), 2 do
                    mine[records[k]] = true
                end
                local kept_ids = {}
                if #members > 0 then
                    local scores = call('ZMSCORE', set_key, unpack(members))
                    for k, m in ipairs(members) do
                        if scores[k] or mine[m] then
                            kept_ids[#kept_ids + 1] = ',' .. sub(m, #who + 2)
                        end
                    end
                end
                local kept = table.concat(kept_ids)
                local value = #kept_ids > 0 and kept or false
                if value ~= list then
                    sets, at = sets or {}, at or {}
                    local k = at[field]
                    if not k then
                        k = #sets + 1
                        at[field] = k
                        sets[k] = field
                    end
                    sets[k + 1] = value
                    deleted = deleted or not value
                end
                return #kept_ids, kept
            end
        end
        if count >= limit then
            if set_key and member and open and count - still_open(user, open) < limit then
                answer = {9, count}
                break
            end
            answer = {2, count}
            break
        end

        -- Times go to Redis as the strings they came in (the claim's now, the hash's
        -- validEndTime), and the count as %d, not as Lua numbers: a number is formatted with
        -- printf's floating point, a measurable share of the script.
        -- The writes go into sets (field, value, ...), the count first, then the marker and the
        -- list, written out rather than looped (each Lua step counts at this rate). at[field] is
        -- the field's index there, for the call's later claims: the last claim (the only one of
        -- a call of one) adds nothing to it, a table's growth being a measurable share.
        taken = taken + 1
        stock = stock - 1
        count = count + 1
        local n = count == 1 and '1' or format('%d', count) -- a first claim: no printf
        if end_ms > users_expire then
            users_expire = end_ms
        end
        -- (made with room for one claim's writes, or 12 claims')
        if not sets then
            sets = argc == 6 and {nil, nil, nil, nil, nil, nil} or {
                nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                nil, nil, nil, nil, nil, nil, nil, nil
            }
        end
        local more = i + 4 < argc -- claims follow in this call
        if more then
            at = at or {}
        end
        w = at and at[user]
        if not w then
            w = #sets + 1
            sets[w] = user
            if more then
                at[user] = w
            end
        end
        sets[w + 1] = n
        if member then
            -- Kept at least an hour, so a claim near the end can still be given back exactly
            -- once.
            local keep = now + 3600000
            if end_ms > keep then
                keep = end_ms
            end
            if keep > users_expire then
                users_expire = keep
            end
            local marker
            if set_key then
                -- The record, and its request id in the user's list (once: an earlier attempt
                -- of this request id whose record is still there listed it).
                records = records or (argc == 6 and {nil, nil} or {
                    nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                    nil, nil, nil, nil, nil, nil, nil, nil, nil
                })
                records[nrec + 1], records[nrec + 2] = now_text, member
                nrec = nrec + 2
                -- The set lives a day past its last reservation's keep.
                if keep + 86400000 > set_expire then
                    set_expire = keep + 86400000
                end
                local id = sub(member, #user + 2)
                if open and open ~= '' then
                    local list = open
                    -- A long list (a high limit) drops its settled ids before it grows.
                    if #list > 256 then
                        local _
                        _, list = still_open(user, list)
                    end
                    if not find(list .. ',', ',' .. id .. ',', 1, true) then
                        list = list .. ',' .. id
                    end
                    open = list
                else -- none listed (a user's first claim): no search
                    open = ',' .. id
                end
                if owner ~= '' then
                    marker = n .. ':' .. now_text .. ':' .. owner
                else
                    marker = n .. ':' .. now_text
                end
            else
                marker = n .. ':' .. now_text
            end
            w = at and at[member]
            if not w then
                w = #sets + 1
                sets[w] = member
                if more then
                    at[member] = w
                end
            end
            sets[w + 1] = marker
            if set_key then
                w = at and at[list_field]
                if not w then
                    w = #sets + 1
                    sets[w] = list_field
                    if more then
                        at[list_field] = w
                    end
                end
                sets[w + 1] = open
            end
        end
        answer = {0, count, hours, end_ms}
    until true
    if wrong then
        break
    end
    if out then
        nout = nout + 1
        out[nout] = answer
    end
end
if wrong then -- routed by another number of buckets: every claim goes again, nothing written
    if not out then
        return {10, wrong}
    end
    out = {}
    for _ = 3, argc, 4 do
        out[#out + 1] = {10, wrong}
    end
    return out
end

-- The call's writes, each one command in slices unpack can take (pairs never split). The
-- stock first: Redis does not roll a script back, so a script stopped by an error between them
-- must not leave counts without their stock taken (an oversell); the other way round it only
-- holds units back until the stock is reconciled with the databases (reconcile.h).
if taken > 0 then
    call('HINCRBY', tpl_key, 'stock', -taken)
end
if nrec > 0 and nrec <= 1000 then
    call('ZADD', set_key, unpack(records))
elseif records then
    for i = 1, nrec, 1000 do
        call('ZADD', set_key, unpack(records, i, math.min(i + 999, nrec)))
    end
end
if deleted then -- (rare) the deleted fields out of the HSET, into an HDEL
    local kept, dels = {}, {}
    for k = 1, #sets, 2 do
        if sets[k + 1] then
            kept[#kept + 1] = sets[k]
            kept[#kept + 1] = sets[k + 1]
        else
            dels[#dels + 1] = sets[k]
        end
    end
    for i = 1, #dels, 1000 do
        call('HDEL', users_key, unpack(dels, i, math.min(i + 999, #dels)))
    end
    sets = kept
end
if sets then
    for i = 1, #sets, 1000 do
        call('HSET', users_key, unpack(sets, i, math.min(i + 999, #sets)))
    end
end
-- Those keeps are the same instant for most claims of a template (its end), so an expiry is
-- written only when it moves: a read instead of a write (no append-only file entry) per call.
if users_expire > 0 and call('PEXPIRETIME', users_key) < users_expire then
    call('PEXPIREAT', users_key, format('%d', users_expire))
end
if set_expire > 0 and set_key and call('PEXPIRETIME', set_key) < set_expire then
    call('PEXPIREAT', set_key, format('%d', set_expire))
end
return out or answer
