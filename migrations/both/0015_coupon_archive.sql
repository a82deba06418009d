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
--
-- On each shard also:
--   * the archiver's selection: dead coupons (used, expired, revoked) by the time of their last
--     change. Partial, so unused and locked coupons, the ones claims and payments write, cost
--     it nothing; a coupon enters it when it dies.
--   * the issue trigger again, skipped in a transaction that set quan.archive_restore to 'on'
--     (SET LOCAL): a restore puts archived rows back with an INSERT, which is not an issue.
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
        EXECUTE format($ddl$
            CREATE INDEX t_user_coupon_%1$s_dead_idx ON t_user_coupon_%1$s (update_time, id)
                WHERE status >= 2$ddl$, n);
        EXECUTE format($ddl$
            DROP TRIGGER t_user_coupon_%1$s_issued ON t_user_coupon_%1$s$ddl$, n);
        EXECUTE format($ddl$
            CREATE TRIGGER t_user_coupon_%1$s_issued AFTER INSERT ON t_user_coupon_%1$s
                REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
                WHEN (current_setting('quan.archive_restore', true) IS DISTINCT FROM 'on')
                EXECUTE FUNCTION quan_user_coupon_issued()$ddl$, n);
    END LOOP;
END $$;
