DROP FUNCTION quan_template_stat_rollup();

-- Moves at most max_rows deltas into t_template_stat; returns how many it moved. One caller at
-- a time (the others return 0 at once); the upsert goes in key order.
CREATE FUNCTION quan_template_stat_rollup(max_rows bigint DEFAULT 50000) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    moved bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('quan_template_stat_rollup')) THEN
        RETURN 0;
    END IF;
    WITH d AS (DELETE FROM t_template_stat_delta
                WHERE ctid = ANY (ARRAY(SELECT ctid FROM t_template_stat_delta LIMIT max_rows))
               RETURNING *),
    g AS (
        SELECT d.*, x.grain,
               CASE x.grain WHEN 0 THEN 'epoch'::timestamptz
                            WHEN 1 THEN date_trunc('minute', d.at)
                            ELSE date_trunc('hour', d.at) END AS bucket
          FROM d CROSS JOIN (VALUES (0::smallint), (1::smallint), (2::smallint)) x(grain)
    ), ins AS (
        INSERT INTO t_template_stat AS s
        SELECT coupon_template_id, grain, bucket, max(shop_number),
           sum(issued_claim),
           sum(issued_mq),
           sum(issued_dist),
           sum(issued_code),
           sum(issued_other),
           sum(new_users),
           sum(locked),
           sum(unlocked),
           sum(used),
           sum(refunded),
           sum(expired),
           sum(revoked),
           sum(discount_cents),
           sum(refund_discount_cents),
           sum(st_unused),
           sum(st_locked),
           sum(st_used),
           sum(st_expired),
           sum(st_revoked)
          FROM g GROUP BY coupon_template_id, grain, bucket
         ORDER BY coupon_template_id, grain, bucket
        ON CONFLICT (coupon_template_id, grain, bucket) DO UPDATE SET
        issued_claim = s.issued_claim + excluded.issued_claim,
        issued_mq = s.issued_mq + excluded.issued_mq,
        issued_dist = s.issued_dist + excluded.issued_dist,
        issued_code = s.issued_code + excluded.issued_code,
        issued_other = s.issued_other + excluded.issued_other,
        new_users = s.new_users + excluded.new_users,
        locked = s.locked + excluded.locked,
        unlocked = s.unlocked + excluded.unlocked,
        used = s.used + excluded.used,
        refunded = s.refunded + excluded.refunded,
        expired = s.expired + excluded.expired,
        revoked = s.revoked + excluded.revoked,
        discount_cents = s.discount_cents + excluded.discount_cents,
        refund_discount_cents = s.refund_discount_cents + excluded.refund_discount_cents,
        st_unused = s.st_unused + excluded.st_unused,
        st_locked = s.st_locked + excluded.st_locked,
        st_used = s.st_used + excluded.st_used,
        st_expired = s.st_expired + excluded.st_expired,
        st_revoked = s.st_revoked + excluded.st_revoked
    )
    SELECT count(*) INTO moved FROM d;
    RETURN moved;
END $fn$;
