-- Database ds_1: shards 8-15 of the 16-way tables (templates and their logs by shop_number,
-- settlements by user_id), shards 16-31 of t_user_coupon (32-way, by user_id), and this
-- database's outbox. Unsharded tables live in ds_0 only. The column definitions are the same as
-- in migrations/ds_0/0001_init.sql; integration-tests/test_migrate.sh checks that they match.
-- Shard index = abs((int32)(v ^ (v >>> 32))) % N, database = index / (N / 2) (common/pg/shard.h).
-- Applied in one transaction by quan-migrate.

-- Coupon templates, by shop_number.
DO $$
BEGIN
    FOR i IN 8..15 LOOP
        EXECUTE format($ddl$
            CREATE TABLE %1$I (
                id               bigint       PRIMARY KEY,
                name             varchar(256) NOT NULL,
                shop_number      bigint       NOT NULL,
                source           smallint     NOT NULL,              -- 0 shop, 1 platform
                target           smallint     NOT NULL,              -- 0 one product, 1 whole shop
                goods            varchar(64),                        -- product id when target = 0
                type             smallint     NOT NULL,              -- 0 amount off, 1 threshold, 2 rate
                valid_start_time timestamptz  NOT NULL,
                valid_end_time   timestamptz  NOT NULL,
                stock            integer      NOT NULL CHECK (stock >= 0),
                receive_rule     jsonb        NOT NULL DEFAULT '{}',
                consume_rule     jsonb        NOT NULL DEFAULT '{}',
                status           smallint     NOT NULL DEFAULT 0 CHECK (status IN (0, 1)), -- 0 active, 1 ended
                create_time      timestamptz  NOT NULL DEFAULT now(),
                update_time      timestamptz  NOT NULL DEFAULT now(),
                del_flag         smallint     NOT NULL DEFAULT 0,
                CHECK (valid_end_time > valid_start_time)
            )$ddl$, 't_coupon_template_' || i);
        -- merchant pages (keyset by id within a shop) and the template-end sweeper
        EXECUTE format('CREATE INDEX %I ON %I (shop_number, id)',
                       't_coupon_template_' || i || '_shop_idx', 't_coupon_template_' || i);
        EXECUTE format('CREATE INDEX %I ON %I (status, valid_end_time)',
                       't_coupon_template_' || i || '_end_idx', 't_coupon_template_' || i);
    END LOOP;
END $$;

-- Template operation log, by shop_number (same shard as its template).
DO $$
BEGIN
    FOR i IN 8..15 LOOP
        EXECUTE format($ddl$
            CREATE TABLE %1$I (
                id                 bigint      PRIMARY KEY,
                shop_number        bigint      NOT NULL,
                coupon_template_id bigint      NOT NULL,
                operator_id        bigint,
                operation_log      text        NOT NULL,
                original_data      jsonb,
                modified_data      jsonb,
                create_time        timestamptz NOT NULL DEFAULT now()
            )$ddl$, 't_coupon_template_log_' || i);
        EXECUTE format('CREATE INDEX %I ON %I (shop_number, coupon_template_id, create_time)',
                       't_coupon_template_log_' || i || '_tpl_idx', 't_coupon_template_log_' || i);
    END LOOP;
END $$;

-- User coupons (the wallet's ledger), by user_id, 32-way.
DO $$
BEGIN
    FOR i IN 16..31 LOOP
        EXECUTE format($ddl$
            CREATE TABLE %1$I (
                id                 bigint      PRIMARY KEY,
                user_id            bigint      NOT NULL,
                coupon_template_id bigint      NOT NULL,
                shop_number        bigint,                 -- the template's shop, to route back to it
                receive_time       timestamptz NOT NULL DEFAULT now(),
                receive_count      integer     NOT NULL CHECK (receive_count >= 1), -- 1 = first
                valid_start_time   timestamptz NOT NULL,
                valid_end_time     timestamptz NOT NULL,
                use_time           timestamptz,
                source             smallint    NOT NULL DEFAULT 0, -- 0 claim centre, 1 platform, 2 shop
                status             smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 4),
                                   -- 0 unused, 1 locked, 2 used, 3 expired, 4 revoked
                request_id         varchar(64),            -- the claim's request id, if any
                create_time        timestamptz NOT NULL DEFAULT now(),
                update_time        timestamptz NOT NULL DEFAULT now(),
                del_flag           smallint    NOT NULL DEFAULT 0,
                -- the per-user limit, enforced in the DB for every entry point (claim, MQ, task)
                CONSTRAINT %2$I UNIQUE (user_id, coupon_template_id, receive_count)
            )$ddl$, 't_user_coupon_' || i, 't_user_coupon_' || i || '_user_tpl_count_key');
        EXECUTE format('CREATE INDEX %I ON %I (user_id, status)',
                       't_user_coupon_' || i || '_user_status_idx', 't_user_coupon_' || i);
        -- expiry sweeper: status = 0 AND valid_end_time <= now()
        EXECUTE format('CREATE INDEX %I ON %I (status, valid_end_time)',
                       't_user_coupon_' || i || '_expiry_idx', 't_user_coupon_' || i);
        -- a retried claim (same request id) never makes a second coupon
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (user_id, request_id) WHERE request_id IS NOT NULL',
                       't_user_coupon_' || i || '_request_key', 't_user_coupon_' || i);
    END LOOP;
END $$;

-- Settlements (a coupon locked for an order), by user_id.
DO $$
BEGIN
    FOR i IN 8..15 LOOP
        EXECUTE format($ddl$
            CREATE TABLE %1$I (
                id          bigint      PRIMARY KEY,
                order_id    bigint      NOT NULL,
                user_id     bigint      NOT NULL,
                coupon_id   bigint      NOT NULL,  -- a t_user_coupon id
                status      smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 3),
                            -- 0 locked, 1 cancelled, 2 paid, 3 refunded
                create_time timestamptz NOT NULL DEFAULT now(),
                update_time timestamptz NOT NULL DEFAULT now()
            )$ddl$, 't_coupon_settlement_' || i);
        -- at most one locked or paid settlement per coupon
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (coupon_id) WHERE status IN (0, 2)',
                       't_coupon_settlement_' || i || '_active_coupon_key', 't_coupon_settlement_' || i);
        EXECUTE format('CREATE INDEX %I ON %I (user_id, order_id)',
                       't_coupon_settlement_' || i || '_user_idx', 't_coupon_settlement_' || i);
        -- sweeper for settlements left locked (an order never paid)
        EXECUTE format('CREATE INDEX %I ON %I (create_time) WHERE status = 0',
                       't_coupon_settlement_' || i || '_locked_idx', 't_coupon_settlement_' || i);
    END LOOP;
END $$;

\ir ../both/0001_init.sql
