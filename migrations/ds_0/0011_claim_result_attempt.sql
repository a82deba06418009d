-- Which attempt of a claim a FAILED outcome belongs to: the reservation's time (ms), as in
-- t_claim_ledger.void_resv_ms. A request id may be claimed again after an attempt was given up
-- (the client's retry reserves anew); a redelivered message of the retry must not be taken for
-- the given-up attempt that failed. NULL: written before this column, any attempt.
ALTER TABLE t_claim_result ADD COLUMN resv_ms bigint;
