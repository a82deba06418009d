-- Template statistics and coupon history, kept by the database itself.
--
-- Every change of a user coupon goes through t_user_coupon_N, whatever path made it (claim, MQ
-- claim, distribution task, exchange code, payment, refund, cancel, timeout, expiry). Triggers
-- on those tables keep, in the same transaction as the change:
--   * t_user_coupon_log_N: one row per status change of a coupon (append-only, same shard as the
--     coupon). A coupon's issue is its own row in t_user_coupon_N (channel, request id, time),
--     never changed afterwards, so it is not written twice.
--   * t_template_stat_delta: what each statement changed, per template (one row per template
--     and statement: a batch of a thousand coupons adds one row). Append-only: a hot
--     template's claims never queue on a counter's row lock (an upsert of one counter row per
--     claim made single-row inserts five times slower). A redelivered message changes no row,
--     so it adds nothing; a rollback takes its deltas with it.
--   * t_template_stat: the deltas rolled up per template, since the start (grain 0), per minute
--     (1) and per hour (2), by quan_template_stat_rollup() (merchant-admin calls it every
--     second). Moving a delta is one transaction (DELETE ... RETURNING into the upsert), so a
--     reader that adds the undrained deltas to the rolled-up rows in one statement is exact
--     whether the rollup ran or not.
--
-- Columns the writers set on t_user_coupon_N:
--   channel        how it was issued: 0 claim, 1 MQ claim, 2 distribution task, 3 exchange code
--                  (NULL: issued before statistics existed)
--   discount_cents what the order saves with it, set when it is locked for the order; counted
--                  when the payment commits, given back on refund
--   last_ref       what the last change belongs to ("order:<id>", ...), for the history
--   last_actor     who made it ("payment", "payment-timeout", "expiry", ...)
-- This database holds t_user_coupon_0..15; ds_1's file is the same but for that range.

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

-- The shards of this database: the new columns, the history table and the triggers.
DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format($ddl$
            ALTER TABLE t_user_coupon_%1$s
                ADD COLUMN channel        smallint,
                ADD COLUMN discount_cents bigint NOT NULL DEFAULT 0,
                ADD COLUMN last_ref       varchar(96),
                ADD COLUMN last_actor     varchar(64)$ddl$, i);
        EXECUTE format($ddl$
            CREATE TABLE t_user_coupon_log_%1$s (
                id                 bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                user_id            bigint      NOT NULL,
                coupon_id          bigint      NOT NULL,
                coupon_template_id bigint      NOT NULL,
                shop_number        bigint      NOT NULL,
                from_status        smallint    NOT NULL,
                to_status          smallint    NOT NULL,
                discount_cents     bigint      NOT NULL DEFAULT 0,  -- paid: saved; refunded: given back
                ref                varchar(96),
                actor              varchar(64),
                create_time        timestamptz NOT NULL DEFAULT clock_timestamp()
            )$ddl$, i);
        -- a coupon's history in order (the user knows the coupon; the shop reads by coupon id)
        EXECUTE format($ddl$
            CREATE INDEX t_user_coupon_log_%1$s_coupon_idx ON t_user_coupon_log_%1$s (coupon_id, id)$ddl$, i);
        -- status changes of one statement: history rows, then the deltas (a function per shard: its
        -- history table is named in static SQL, so the plans are cached)
        EXECUTE format($ddl$
            CREATE FUNCTION quan_user_coupon_changed_%1$s() RETURNS trigger
            LANGUAGE plpgsql AS $fn$
            BEGIN
                WITH ch AS (
                    SELECT n.id, n.user_id, n.coupon_template_id AS t, coalesce(n.shop_number, 0) AS shop,
                           o.status AS f, n.status AS s, n.last_ref, n.last_actor,
                           CASE WHEN o.status = 1 AND n.status = 2 THEN n.discount_cents
                                WHEN o.status = 2 AND n.status = 0 THEN o.discount_cents
                                ELSE 0 END AS disc
                      FROM new_rows n JOIN old_rows o ON o.id = n.id
                     WHERE n.status <> o.status
                ), logged AS (
                    INSERT INTO t_user_coupon_log_%1$s (user_id, coupon_id, coupon_template_id, shop_number,
                                                      from_status, to_status, discount_cents, ref, actor)
                    SELECT user_id, id, t, shop, f, s, disc, last_ref, last_actor FROM ch
                )
                INSERT INTO t_template_stat_delta (coupon_template_id, shop_number, locked, unlocked, used,
                                                   refunded, expired, revoked, discount_cents,
                                                   refund_discount_cents, st_unused, st_locked, st_used,
                                                   st_expired, st_revoked)
                SELECT t, max(shop),
                       count(*) FILTER (WHERE f = 0 AND s = 1), count(*) FILTER (WHERE f = 1 AND s = 0),
                       count(*) FILTER (WHERE f = 1 AND s = 2), count(*) FILTER (WHERE f = 2 AND s = 0),
                       count(*) FILTER (WHERE s = 3), count(*) FILTER (WHERE s = 4),
                       coalesce(sum(disc) FILTER (WHERE f = 1 AND s = 2), 0),
                       coalesce(sum(disc) FILTER (WHERE f = 2 AND s = 0), 0),
                       count(*) FILTER (WHERE s = 0) - count(*) FILTER (WHERE f = 0),
                       count(*) FILTER (WHERE s = 1) - count(*) FILTER (WHERE f = 1),
                       count(*) FILTER (WHERE s = 2) - count(*) FILTER (WHERE f = 2),
                       count(*) FILTER (WHERE s = 3) - count(*) FILTER (WHERE f = 3),
                       count(*) FILTER (WHERE s = 4) - count(*) FILTER (WHERE f = 4)
                  FROM ch GROUP BY t;
                RETURN NULL;
            END $fn$
            $ddl$, i);
        EXECUTE format($ddl$
            CREATE TRIGGER t_user_coupon_%1$s_issued AFTER INSERT ON t_user_coupon_%1$s
                REFERENCING NEW TABLE AS new_rows
                FOR EACH STATEMENT EXECUTE FUNCTION quan_user_coupon_issued()$ddl$, i);
        EXECUTE format($ddl$
            CREATE TRIGGER t_user_coupon_%1$s_changed AFTER UPDATE ON t_user_coupon_%1$s
                REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
                FOR EACH STATEMENT EXECUTE FUNCTION quan_user_coupon_changed_%1$s()$ddl$, i);
    END LOOP;
END $$;
