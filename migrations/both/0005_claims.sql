CREATE TABLE t_claim_ledger (
    user_id            bigint      NOT NULL,
    request_id         varchar(64) NOT NULL,
    coupon_template_id bigint      NOT NULL,
    create_time        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, request_id)
);
