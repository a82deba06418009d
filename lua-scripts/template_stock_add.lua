-- template_stock_add.lua: HINCRBY stock on a template cache hash only if the hash exists, so
-- a missing hash is never recreated as a partial one holding only "stock"; the engine
-- rebuilds a missing hash whole from the database, which already has the new stock.
--   KEYS[1] quan:tpl:{<templateId>}
--   ARGV[1] the increment (integer)
--   ARGV[2] optional: the template's stock buckets the caller read with the row it changed
--   (bucket.h); a hash whose "buckets" (absent: 1) says another number was rebuilt on a new
--   number since (services/engine/relayout.h), from a row that already counts these units:
--   nothing is added
-- A hash without its stock field is closed (a rebuild from the databases, or a change of the
-- template's stock buckets, is under way: services/engine/reconcile.h, relayout.h): nothing is
-- added, since that rebuild writes the stock the databases give, which already counts these
-- units; an increment here would reopen the hash with them beside it.
-- Returns the new stock, or nil when the hash is absent, closed or of another number. The
-- hash's generation ("gen") rises with the stock: the sold-out verdict over a template's stock
-- buckets takes a bucket seen twice at 0 with the same generation for one that held nothing in
-- between (bucket.h).
local f = redis.call('HMGET', KEYS[1], 'stock', 'buckets')
if not f[1] or (ARGV[2] and ARGV[2] ~= '' and (f[2] or '1') ~= ARGV[2]) then
    return false
end
local stock = redis.call('HINCRBY', KEYS[1], 'stock', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
return stock
