-- claim.lua: the claim gate of one user on one coupon template, in ONE Redis round trip
-- (replaces the reference's stock_decrement_and_save_user_receive.lua). Everything it needs is
-- read from the template hash, so the caller passes no template data: limitPerPerson from
-- receiveRule, validityPeriod from consumeRule.
--
-- Keys (all carry the hash tag {<templateId>}, so they live in one Redis Cluster slot):
--   KEYS[1] quan:tpl:{<templateId>}                        hash (template.h fields)
--   KEYS[2] quan:tpl:{<templateId>}:user:<userId>           counter: coupons this user claimed
--   KEYS[3] quan:tpl:{<templateId>}:req:<userId>:<reqId>    optional: this claim's marker; it
--           makes a retried request id claim at most once and claim_undo exactly-once. Its
--           value is "<count>:<now>": the reservation's time names this attempt in the database
--   KEYS[4] quan:tpl:{<templateId>}:resv                    optional (with KEYS[3]): the
--           reservations not yet settled (no coupon row, no give-back yet), member ARGV[3],
--           score now; whoever settles one removes it, and the engine's sweeper settles those
--           of a process that died
--   KEYS[5] quan:tpl:{<templateId>}:resv:who                optional (with KEYS[4]): the same
--           reservations by user and owner, score 0, member "<ARGV[3]>@<ARGV[4]>" (read by
--           range: a user's own, the owner of one)
-- Arguments:
--   ARGV[1] now (epoch ms)
--   ARGV[2] the shop number the client named, checked against the hash's; "" or "0" skips it
--   ARGV[3] with KEYS[4]: the reservation's member, "<userId>:<reqId>"
--   ARGV[4] with KEYS[5]: the engine process that reserves ("<instance>/<run>", resv.h)
--
-- More claims of the same template in one call (the engine gathers those of a loop turn: one
-- script run instead of one each, the template read once): with all five keys, each further
-- claim adds two keys, its counter and its marker (KEYS[6], KEYS[7], then KEYS[8], KEYS[9]...),
-- and three arguments, its now, shop number and member (ARGV[5..7], ARGV[8..10]...). The claims
-- are taken in order, each exactly as if called alone, and the answer is then an array of
-- their answers, in order.
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
local expire_at = 0 -- the latest expiry a reservation set needs (written once, at the end)

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

-- One claim: its counter and marker keys, its now (the text it came as), shop and member.
local function claim(k_count, k_req, now_text, shop, member)
    local now = tonumber(now_text)
    if not now then
        return redis.error_reply('ERR claim.lua: bad arguments (now, shopNumber)')
    end
    if k_req then
        local done = redis.call('GET', k_req)
        if done then
            local n, t = string.match(done, '^(%d+):?(%d*)$')
            return {7, tonumber(n) or 0, tonumber(t) or 0}
        end
    end
    if not f then
        f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime',
                       'shopNumber', 'receiveRule', 'consumeRule')
        f[1], f[2], f[3] = tonumber(f[1]), tonumber(f[2]), tonumber(f[3])
        f.end_ms = tonumber(f[4])
        if f[1] and f[2] and f[3] and f.end_ms then
            limit, hours = rule(f[6], 'limitPerPerson', 1), rule(f[7], 'validityPeriod', 24)
        end
    end
    if not limit then
        return {5, 0}
    end
    if shop and shop ~= '' and shop ~= '0' and shop ~= f[5] then
        return {6, 0}
    end

    local count = tonumber(redis.call('GET', k_count)) or 0
    if f[2] ~= 0 then
        return {3, count}
    end
    local end_ms = f.end_ms
    if now < f[3] or now > end_ms then
        return {4, count}
    end
    if f[1] <= 0 then
        if KEYS[4] and redis.call('ZCARD', KEYS[4]) > 0 then
            return {8, count}
        end
        return {1, count}
    end
    if count >= limit then
        if KEYS[5] then
            local user = string.match(member, '^[^:]*:')
            local open = redis.call('ZLEXCOUNT', KEYS[5], '[' .. user, '[' .. user .. '\255')
            if count - open < limit then
                return {9, count}
            end
        end
        return {2, count}
    end

    -- Times go to Redis as the strings they came in (the claim's now, the hash's
    -- validEndTime), not as Lua numbers: a number is formatted with printf's floating point, a
    -- measurable share of the script.
    redis.call('HINCRBY', KEYS[1], 'stock', -1)
    f[1] = f[1] - 1
    count = redis.call('INCR', k_count)
    -- Every time, not only on the first claim: harmless, and repairs a counter left without TTL.
    redis.call('PEXPIREAT', k_count, f[4]) -- absolute ms (EXPIRE would read them as seconds)
    if k_req then
        -- Kept at least an hour, so a claim near the end can still be given back exactly once.
        local keep, keep_text = end_ms, f[4]
        if keep < now + 3600000 then
            keep = now + 3600000
            keep_text = string.format('%d', keep)
        end
        redis.call('SET', k_req, count .. ':' .. now_text, 'PXAT', keep_text)
        if KEYS[4] then
            redis.call('ZADD', KEYS[4], now_text, member)
            if KEYS[5] then
                redis.call('ZADD', KEYS[5], 0, member .. '@' .. ARGV[4])
            end
            -- Each set lives a day past its last reservation's keep.
            expire_at = math.max(expire_at, keep + 86400000)
        end
    end
    return {0, count, hours, end_ms}
end

-- That keep is the same instant for most claims of a template (its end), so the expiry is
-- written only when it moves: a read instead of a write (no append-only file entry) per call.
local function keep_sets()
    for i = 4, 5 do
        if expire_at > 0 and KEYS[i] and redis.call('PEXPIRETIME', KEYS[i]) < expire_at then
            redis.call('PEXPIREAT', KEYS[i], string.format('%d', expire_at))
        end
    end
end

if #KEYS <= 5 then
    local out = claim(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
    keep_sets()
    return out
end
local more = #KEYS - 5
if more % 2 ~= 0 or #ARGV ~= 4 + more / 2 * 3 then
    return redis.error_reply('ERR claim.lua: a batch needs 5 keys, then 2 keys and 3 arguments a claim')
end
local out = {claim(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])}
for i = 1, more / 2 do
    out[i + 1] = claim(KEYS[4 + 2 * i], KEYS[5 + 2 * i], ARGV[2 + 3 * i], ARGV[3 + 3 * i],
                       ARGV[4 + 3 * i])
end
keep_sets()
return out
