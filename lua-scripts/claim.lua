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

local now = tonumber(ARGV[1])
if not now then
    return redis.error_reply('ERR claim.lua: bad arguments (now, shopNumber)')
end
if KEYS[3] then
    local done = redis.call('GET', KEYS[3])
    if done then
        local n, t = string.match(done, '^(%d+):?(%d*)$')
        return {7, tonumber(n) or 0, tonumber(t) or 0}
    end
end

local f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime',
                     'shopNumber', 'receiveRule', 'consumeRule')
local stock, status = tonumber(f[1]), tonumber(f[2])
local start_ms, end_ms = tonumber(f[3]), tonumber(f[4])
if not stock or not status or not start_ms or not end_ms then
    return {5, 0}
end
local shop = ARGV[2]
if shop and shop ~= '' and shop ~= '0' and shop ~= f[5] then
    return {6, 0}
end

local count = tonumber(redis.call('GET', KEYS[2])) or 0
if status ~= 0 then
    return {3, count}
end
if now < start_ms or now > end_ms then
    return {4, count}
end
if stock <= 0 then
    if KEYS[4] and redis.call('ZCARD', KEYS[4]) > 0 then
        return {8, count}
    end
    return {1, count}
end

-- The rules are JSON text in the hash (read with the fields above); a malformed rule falls back
-- to the API's defaults.
local function rule(text, name, default)
    local ok, obj = pcall(cjson.decode, text or '{}')
    local v = ok and type(obj) == 'table' and tonumber(obj[name]) or nil
    if not v or v < 1 then
        return default
    end
    return math.floor(v)
end

local limit = rule(f[6], 'limitPerPerson', 1)
if count >= limit then
    if KEYS[5] then
        local user = string.match(ARGV[3], '^[^:]*:')
        local open = redis.call('ZLEXCOUNT', KEYS[5], '[' .. user, '[' .. user .. '\255')
        if count - open < limit then
            return {9, count}
        end
    end
    return {2, count}
end

-- Times go to Redis as the strings they came in (ARGV[1], the hash's validEndTime), not as Lua
-- numbers: a number is formatted with printf's floating point, a measurable share of the script.
redis.call('HINCRBY', KEYS[1], 'stock', -1)
count = redis.call('INCR', KEYS[2])
-- Every time, not only on the first claim: harmless, and repairs a counter left without TTL.
redis.call('PEXPIREAT', KEYS[2], f[4]) -- absolute ms (EXPIRE would read them as seconds)
if KEYS[3] then
    -- Kept at least an hour, so a claim near the end can still be given back exactly once.
    local keep, keep_text = end_ms, f[4]
    if keep < now + 3600000 then
        keep = now + 3600000
        keep_text = string.format('%d', keep)
    end
    redis.call('SET', KEYS[3], count .. ':' .. ARGV[1], 'PXAT', keep_text)
    if KEYS[4] then
        -- Each set lives a day past its last reservation's keep. That is the same instant for
        -- most claims of a template (its end), so the expiry is written only when it moves: a
        -- read instead of a write (no append-only file entry) per claim.
        local expire_at = keep + 86400000
        redis.call('ZADD', KEYS[4], ARGV[1], ARGV[3])
        if redis.call('PEXPIRETIME', KEYS[4]) < expire_at then
            redis.call('PEXPIREAT', KEYS[4], expire_at)
        end
        if KEYS[5] then
            redis.call('ZADD', KEYS[5], 0, ARGV[3] .. '@' .. ARGV[4])
            if redis.call('PEXPIRETIME', KEYS[5]) < expire_at then
                redis.call('PEXPIREAT', KEYS[5], expire_at)
            end
        end
    end
end
return {0, count, rule(f[7], 'validityPeriod', 24), end_ms}
