-- Claims (engine claim.c): the stock ledger of claims, kept in the database of the template's
-- shard (see migrations/ds_0/0005_claims.sql for why). Same definition in ds_0 and ds_1.
CREATE TABLE t_claim_ledger (
    user_id            bigint      NOT NULL,
    request_id         varchar(64) NOT NULL,
    coupon_template_id bigint      NOT NULL,
    create_time        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, request_id)
);
