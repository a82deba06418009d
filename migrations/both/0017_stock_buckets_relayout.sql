-- A change of a live template's stock buckets under way (common/coupon/bucket.h): the number
-- of buckets its Redis state is still laid out on, while stock_buckets already says the new
-- one; NULL when none is under way. Written with stock_buckets in merchant-admin's change, cleared
-- by the engine once every bucket is rebuilt on the new number (services/engine/relayout.h).
-- The loop finds this database's template shards.
DO $$
DECLARE
    n text;
BEGIN
    FOR n IN SELECT substring(tablename FROM '[0-9]+$') FROM pg_tables
              WHERE schemaname = current_schema() AND tablename ~ '^t_coupon_template_[0-9]+$' LOOP
        EXECUTE format($ddl$
            ALTER TABLE t_coupon_template_%1$s
                ADD COLUMN buckets_relayout_from smallint
                    CHECK (buckets_relayout_from BETWEEN 1 AND 64)$ddl$, n);
        EXECUTE format('CREATE INDEX %I ON %I (id) WHERE buckets_relayout_from IS NOT NULL',
                       't_coupon_template_' || n || '_relayout_idx', 't_coupon_template_' || n);
    END LOOP;
END $$;
