CREATE TABLE t_coupon_task_mark (
    task_id     bigint      NOT NULL,
    chunk_no    integer     NOT NULL,
    step        varchar(16) NOT NULL CHECK (step IN ('coupons', 'stock')),
    count       integer     NOT NULL DEFAULT 0,
    create_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, chunk_no, step)
);
