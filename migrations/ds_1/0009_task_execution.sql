-- Execution of distribution tasks by quan-distribution (services/distribution/taskrun.h): the
-- markers of a chunk's writes in this database, as in ds_0 (migrations/ds_0/0009 holds the
-- task's own columns and checkpoints, which live in ds_0 only). Step 'coupons' is written in
-- the transaction that inserts the chunk's coupons of this database's users (count = rows
-- inserted), step 'stock' in the one that takes the template's stock here (count = the coupons
-- issued). A chunk replayed after a crash finds its marker: the step is not done again.
\ir ../both/0009_task_execution.sql
