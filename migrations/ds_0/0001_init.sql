-- Database ds_0: shards 0-7 of the 16-way tables (templates and their logs by shop_number,
-- settlements by user_id), shards 0-15 of t_user_coupon (32-way, by user_id), every unsharded
-- table, and this database's outbox. migrations/ds_1/0001_init.sql holds the other halves with
-- the same column definitions; integration-tests/test_migrate.sh checks that they match.
-- Shard index = abs((int32)(v ^ (v >>> 32))) % N, database = index / (N / 2) (common/pg/shard.h).
-- Times are timestamptz (UTC on the wire); ids are application-generated snowflakes unless a
-- column says otherwise. Applied in one transaction by quan-migrate.

-- Coupon templates, by shop_number.
DO $$
BEGIN
    FOR i IN 0..7 LOOP
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
    FOR i IN 0..7 LOOP
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
    FOR i IN 0..15 LOOP
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
    FOR i IN 0..7 LOOP
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

-- Distribution tasks (unsharded).
CREATE TABLE t_coupon_task (
    id                 bigint       GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    shop_number        bigint       NOT NULL,
    batch_id           bigint       NOT NULL,
    task_name          varchar(128) NOT NULL,
    file_address       varchar(512) NOT NULL,
    fail_file_address  varchar(512),
    send_num           integer,                       -- rows in the sheet, once counted
    notify_type        varchar(32)  NOT NULL DEFAULT '0', -- comma list: 0 site, 1 popup, 2 mail, 3 sms
    coupon_template_id bigint       NOT NULL,
    send_type          smallint     NOT NULL DEFAULT 0 CHECK (send_type IN (0, 1)), -- 0 now, 1 at send_time
    send_time          timestamptz,
    status             smallint     NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 4),
                       -- 0 pending, 1 in progress, 2 failed, 3 succeeded, 4 cancelled
    success_num        integer      NOT NULL DEFAULT 0,
    fail_num           integer      NOT NULL DEFAULT 0,
    processed_rows     integer      NOT NULL DEFAULT 0, -- resume point in the sheet
    execution_id       varchar(64),                    -- owner of the IN_PROGRESS run (CAS)
    completion_time    timestamptz,
    operator_id        bigint,
    create_time        timestamptz  NOT NULL DEFAULT now(),
    update_time        timestamptz  NOT NULL DEFAULT now(),
    del_flag           smallint     NOT NULL DEFAULT 0
);
CREATE INDEX t_coupon_task_due_idx ON t_coupon_task (status, send_time); -- due-task scan
CREATE INDEX t_coupon_task_shop_idx ON t_coupon_task (shop_number, id);
CREATE INDEX t_coupon_task_batch_idx ON t_coupon_task (batch_id);
CREATE INDEX t_coupon_task_template_idx ON t_coupon_task (coupon_template_id);

CREATE TABLE t_coupon_task_fail (
    id          bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    batch_id    bigint      NOT NULL,
    task_id     bigint      NOT NULL,
    row_num     integer     NOT NULL,  -- 1-based data row of the sheet
    user_id     text,                  -- as read from the sheet, may be malformed
    cause       text        NOT NULL,
    create_time timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX t_coupon_task_fail_batch_idx ON t_coupon_task_fail (batch_id, id);

-- Reservation reminders; information is a bitmap of (remind type x 5-minute slot).
CREATE TABLE t_coupon_template_remind (
    user_id            bigint      NOT NULL,
    coupon_template_id bigint      NOT NULL,
    information        bigint      NOT NULL DEFAULT 0,
    shop_number        bigint      NOT NULL,
    start_time         timestamptz NOT NULL, -- the template's valid_start_time
    create_time        timestamptz NOT NULL DEFAULT now(),
    update_time        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, coupon_template_id)
);
CREATE INDEX t_coupon_template_remind_start_idx ON t_coupon_template_remind (start_time);

-- Outcome of an MQ claim, read by request id (a claim ends in a coupon or an explicit failure).
CREATE TABLE t_claim_result (
    request_id         varchar(64) PRIMARY KEY,
    user_id            bigint      NOT NULL,
    coupon_template_id bigint      NOT NULL,
    status             smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 2),
                       -- 0 pending, 1 success, 2 failed
    user_coupon_id     bigint,
    reason             text,
    create_time        timestamptz NOT NULL DEFAULT now(),
    update_time        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX t_claim_result_pending_idx ON t_claim_result (create_time) WHERE status = 0;

-- Exchange codes (unforgeable, spent once): random codes under a unique index, redeemed by a
-- conditional UPDATE ... WHERE status = 1 in the same transaction as the coupon insert.
CREATE TABLE t_exchange_code_batch (
    id                 bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    shop_number        bigint      NOT NULL,
    coupon_template_id bigint      NOT NULL,
    count              integer     NOT NULL CHECK (count BETWEEN 1 AND 1000000),
    generated          integer     NOT NULL DEFAULT 0, -- codes written so far (async generation)
    status             smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 2),
                       -- 0 generating, 1 ready, 2 failed
    create_time        timestamptz NOT NULL DEFAULT now(),
    update_time        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX t_exchange_code_batch_shop_idx ON t_exchange_code_batch (shop_number, id);
CREATE INDEX t_exchange_code_batch_template_idx ON t_exchange_code_batch (coupon_template_id);

CREATE TABLE t_exchange_code (
    id                 bigint      PRIMARY KEY,
    batch_id           bigint      NOT NULL,
    coupon_template_id bigint      NOT NULL,
    shop_number        bigint      NOT NULL,
    code               varchar(32) NOT NULL UNIQUE,
    status             smallint    NOT NULL DEFAULT 1 CHECK (status BETWEEN 1 AND 3),
                       -- 1 unused, 2 redeemed, 3 campaign ended
    user_id            bigint,
    user_coupon_id     bigint,
    redeem_time        timestamptz,
    create_time        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX t_exchange_code_batch_idx ON t_exchange_code (batch_id, id);

\ir ../both/0001_init.sql
