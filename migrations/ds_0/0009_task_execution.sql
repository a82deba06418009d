-- Execution of distribution tasks by quan-distribution (services/distribution/taskrun.h).
--
-- 1. The task row: the run that owns it is execution_id while lease_until is in the future
--    (taken by a conditional UPDATE, renewed while the run goes on, released when it stops); a
--    run whose process died loses it when the lease runs out, and the next run resumes after
--    the last committed chunk (processed_rows). chunk_rows is the chunk size the task started
--    with, so a resume cuts the rest of the sheet into the same chunks. fail_reason says why a
--    task failed (status 2); cancel_requested is a cancel asked of a running task: its run
--    stops at the next chunk boundary and sets status 4.
ALTER TABLE t_coupon_task
    ADD COLUMN lease_until      timestamptz,
    ADD COLUMN chunk_rows       integer CHECK (chunk_rows > 0),
    ADD COLUMN fail_reason      text,
    ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
-- The sweep of tasks in progress whose run stopped (lease expired, last touched long ago).
CREATE INDEX t_coupon_task_running_idx ON t_coupon_task (update_time) WHERE status = 1;

-- 2. Checkpoints: one row per committed chunk, written in the transaction (fenced by the
--    execution id) that adds the chunk's counts to the task, records its failures and its
--    notification event. The key makes a chunk count once.
CREATE TABLE t_coupon_task_chunk (
    task_id      bigint      NOT NULL,
    chunk_no     integer     NOT NULL,
    first_row    integer     NOT NULL, -- data rows before the chunk
    row_count    integer     NOT NULL,
    issued       integer     NOT NULL,
    failed       integer     NOT NULL,
    execution_id varchar(64) NOT NULL,
    create_time  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, chunk_no)
);

-- 3. Markers of a chunk's writes in this database (the same table is in ds_1): step 'coupons'
--    is written in the transaction that inserts the chunk's coupons of this database's users
--    (count = rows inserted), step 'stock' in the one that takes the template's stock here
--    (count = the coupons issued). A chunk replayed after a crash finds its marker: the step
--    is not done again.
\ir ../both/0009_task_execution.sql
