-- Archive tables of the dead coupons (services/engine/archive.h), one pair per coupon shard of
-- the database, beside it: a batch moves a coupon and its history in one local transaction.
--
--   t_user_coupon_archive_N      archive_time (when it moved), then the columns of
--                                t_user_coupon_N in their order (an archived row is
--                                "now(), c.*"); no trigger: a move is not a status change
--   t_user_coupon_log_archive_N  the columns of t_user_coupon_log_N in their order
--
-- A column added to t_user_coupon_N or t_user_coupon_log_N later is added to its archive table
-- in the same migration (migrations/README.md). The loop finds this database's shards.
DO $$
DECLARE
    n text;
BEGIN
    FOR n IN SELECT substring(tablename FROM '[0-9]+$') FROM pg_tables
              WHERE schemaname = current_schema() AND tablename ~ '^t_user_coupon_[0-9]+$' LOOP
        EXECUTE format($ddl$
            CREATE TABLE t_user_coupon_archive_%1$s (
                archive_time timestamptz NOT NULL DEFAULT now(),
                LIKE t_user_coupon_%1$s,
                PRIMARY KEY (id)
            )$ddl$, n);
        -- a user's coupons (restore by user)
        EXECUTE format($ddl$
            CREATE INDEX t_user_coupon_archive_%1$s_user_idx ON t_user_coupon_archive_%1$s (user_id)$ddl$, n);
        EXECUTE format($ddl$
            CREATE TABLE t_user_coupon_log_archive_%1$s (
                LIKE t_user_coupon_log_%1$s,
                PRIMARY KEY (id)
            )$ddl$, n);
        EXECUTE format($ddl$
            CREATE INDEX t_user_coupon_log_archive_%1$s_coupon_idx
                ON t_user_coupon_log_archive_%1$s (coupon_id, id)$ddl$, n);
    END LOOP;
END $$;

-- A restore puts archived rows back into t_user_coupon_N with an INSERT, which is not an issue:
-- inside a transaction that set quan.archive_restore to 'on' (SET LOCAL), the trigger of new
-- coupons counts nothing. Otherwise the function of 0012, unchanged.
CREATE OR REPLACE FUNCTION quan_user_coupon_issued() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('quan.archive_restore', true) = 'on' THEN
        RETURN NULL;
    END IF;
    INSERT INTO t_template_stat_delta (coupon_template_id, shop_number, issued_claim, issued_mq,
                                       issued_dist, issued_code, issued_other, new_users,
                                       expired, revoked, st_unused, st_locked, st_used,
                                       st_expired, st_revoked)
    SELECT coupon_template_id, max(coalesce(shop_number, 0)),
           count(*) FILTER (WHERE channel = 0), count(*) FILTER (WHERE channel = 1),
           count(*) FILTER (WHERE channel = 2), count(*) FILTER (WHERE channel = 3),
           count(*) FILTER (WHERE channel IS NULL OR channel NOT BETWEEN 0 AND 3),
           count(*) FILTER (WHERE receive_count = 1),
           count(*) FILTER (WHERE status = 3), count(*) FILTER (WHERE status = 4),
           count(*) FILTER (WHERE status = 0), count(*) FILTER (WHERE status = 1),
           count(*) FILTER (WHERE status = 2), count(*) FILTER (WHERE status = 3),
           count(*) FILTER (WHERE status = 4)
      FROM new_rows GROUP BY coupon_template_id;
    RETURN NULL;
END $fn$;

-- The archiver's selection: dead coupons (used, expired, revoked) by the time of their last
-- change. Partial, so unused and locked coupons, the ones claims and payments write, cost it
-- nothing; a coupon enters it when it dies.
DO $$
DECLARE
    n text;
BEGIN
    FOR n IN SELECT substring(tablename FROM '[0-9]+$') FROM pg_tables
              WHERE schemaname = current_schema() AND tablename ~ '^t_user_coupon_[0-9]+$' LOOP
        EXECUTE format($ddl$
            CREATE INDEX t_user_coupon_%1$s_dead_idx ON t_user_coupon_%1$s (update_time, id)
                WHERE status >= 2$ddl$, n);
    END LOOP;
END $$;
