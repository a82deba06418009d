CREATE TABLE t_template_stat_delta (
    coupon_template_id    bigint      NOT NULL,
    shop_number           bigint      NOT NULL,
    at                    timestamptz NOT NULL DEFAULT now(),
    issued_claim          bigint      NOT NULL DEFAULT 0,
    issued_mq             bigint      NOT NULL DEFAULT 0,
    issued_dist           bigint      NOT NULL DEFAULT 0,
    issued_code           bigint      NOT NULL DEFAULT 0,
    issued_other          bigint      NOT NULL DEFAULT 0,
    new_users             bigint      NOT NULL DEFAULT 0,  -- first coupon of the template
    locked                bigint      NOT NULL DEFAULT 0,  -- unused -> locked
    unlocked              bigint      NOT NULL DEFAULT 0,  -- locked -> unused (cancel, timeout)
    used                  bigint      NOT NULL DEFAULT 0,  -- locked -> used (paid)
    refunded              bigint      NOT NULL DEFAULT 0,  -- used -> unused
    expired               bigint      NOT NULL DEFAULT 0,
    revoked               bigint      NOT NULL DEFAULT 0,
    discount_cents        bigint      NOT NULL DEFAULT 0,  -- saved by payments
    refund_discount_cents bigint      NOT NULL DEFAULT 0,  -- given back by refunds
    st_unused             bigint      NOT NULL DEFAULT 0,  -- net change of coupons in each status
    st_locked             bigint      NOT NULL DEFAULT 0,
    st_used               bigint      NOT NULL DEFAULT 0,
    st_expired            bigint      NOT NULL DEFAULT 0,
    st_revoked            bigint      NOT NULL DEFAULT 0
);

CREATE TABLE t_template_stat (
    coupon_template_id    bigint      NOT NULL,
    grain                 smallint    NOT NULL,  -- 0 since the start, 1 minute, 2 hour
    bucket                timestamptz NOT NULL,  -- the minute or hour; epoch for grain 0
    shop_number           bigint      NOT NULL,
    issued_claim          bigint      NOT NULL DEFAULT 0,
    issued_mq             bigint      NOT NULL DEFAULT 0,
    issued_dist           bigint      NOT NULL DEFAULT 0,
    issued_code           bigint      NOT NULL DEFAULT 0,
    issued_other          bigint      NOT NULL DEFAULT 0,
    new_users             bigint      NOT NULL DEFAULT 0,  -- first coupon of the template
    locked                bigint      NOT NULL DEFAULT 0,  -- unused -> locked
    unlocked              bigint      NOT NULL DEFAULT 0,  -- locked -> unused (cancel, timeout)
    used                  bigint      NOT NULL DEFAULT 0,  -- locked -> used (paid)
    refunded              bigint      NOT NULL DEFAULT 0,  -- used -> unused
    expired               bigint      NOT NULL DEFAULT 0,
    revoked               bigint      NOT NULL DEFAULT 0,
    discount_cents        bigint      NOT NULL DEFAULT 0,  -- saved by payments
    refund_discount_cents bigint      NOT NULL DEFAULT 0,  -- given back by refunds
    st_unused             bigint      NOT NULL DEFAULT 0,  -- net change of coupons in each status
    st_locked             bigint      NOT NULL DEFAULT 0,
    st_used               bigint      NOT NULL DEFAULT 0,
    st_expired            bigint      NOT NULL DEFAULT 0,
    st_revoked            bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (coupon_template_id, grain, bucket)
);
-- the shop summary: every template of a shop, since the start
CREATE INDEX t_template_stat_shop_idx ON t_template_stat (shop_number, coupon_template_id)
    WHERE grain = 0;

-- Moves the deltas into t_template_stat; returns how many deltas it moved. One caller at a time
-- (the others return 0 at once); the upsert goes in key order.
CREATE FUNCTION quan_template_stat_rollup() RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    moved bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('quan_template_stat_rollup')) THEN
        RETURN 0;
    END IF;
    WITH d AS (DELETE FROM t_template_stat_delta RETURNING *),
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

-- New coupons of one statement: counted by channel, first coupons of a user, status.
CREATE FUNCTION quan_user_coupon_issued() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
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
