-- consume_guard.lua: the idempotent-consume guard (common/redis/guard.h).
--   KEYS[1] the message's guard key, ARGV[1] "0" (CONSUMING), ARGV[2] TTL in ms.
-- Returns nil when this consumer took the key (run the business logic), otherwise the old
-- value: "0" another consumer is at it (retry later, no ack), "1" already consumed (ack, skip).
-- SET with both NX and GET needs Redis >= 7.0.
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])
