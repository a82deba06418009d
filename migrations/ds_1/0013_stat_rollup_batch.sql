-- quan_template_stat_rollup moves at most max_rows deltas per call.
--
-- 0012's rollup moved every delta in one statement. The services' connections run with a
-- statement_timeout (QUAN_PG_STATEMENT_TIMEOUT_MS, 5 s by default): a backlog the rollup could
-- not move within it (merchant-admin down for a while under load: about a million deltas) made
-- every rollup time out and roll back, so the backlog only grew and every read summed more
-- deltas. Now a call moves a bounded batch, picked by ctid (one rollup at a time holds the
-- advisory lock and deltas are never updated, so the rows it picks stay as they are), and
-- merchant-admin calls again while a call moved a full batch. A batch is one transaction, as
-- before: a reader adding the deltas not rolled up to the rolled-up rows in one statement stays
-- exact. ds_0's file is the same.

\ir ../both/0013_stat_rollup_batch.sql
