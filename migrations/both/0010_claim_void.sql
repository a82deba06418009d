-- Abandoned reservations (engine resv.c). A claim reserves in Redis first and writes the
-- database after; when the process that reserved dies in between, the reservation sweeper gives
-- it back in Redis, but first records here that this attempt will never take stock: a ledger
-- row with void_resv_ms = the reservation's time (ms), which takes no stock. A writer of that
-- attempt arriving late (a stalled transaction, a message published just before the crash)
-- finds it and writes nothing; a later attempt with the same request id (a new reservation,
-- another time) takes the row over. The give-back never deletes such a row.
ALTER TABLE t_claim_ledger ADD COLUMN void_resv_ms bigint;
