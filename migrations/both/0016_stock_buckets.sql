-- The number of stock buckets of a template (common/coupon/bucket.h): its stock spread over
-- that many Redis hash tags, so one sale runs on as many Redis masters. 1, the default, is the
-- template as it always was. The loop finds this database's template shards.
DO $$
DECLARE
    n text;
BEGIN
    FOR n IN SELECT substring(tablename FROM '[0-9]+$') FROM pg_tables
              WHERE schemaname = current_schema() AND tablename ~ '^t_coupon_template_[0-9]+$' LOOP
        EXECUTE format($ddl$
            ALTER TABLE t_coupon_template_%1$s
                ADD COLUMN stock_buckets smallint NOT NULL DEFAULT 1
                    CHECK (stock_buckets BETWEEN 1 AND 64)$ddl$, n);
    END LOOP;
END $$;
