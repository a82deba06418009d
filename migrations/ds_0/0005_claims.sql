-- Claims (engine claim.c).
-- 1. A claim's request id is chosen by the client and unique per user only, so the
--    outcome of an MQ claim is keyed by (user_id, request_id): one user can never read or
--    overwrite another user's result.
ALTER TABLE t_claim_result DROP CONSTRAINT t_claim_result_pkey;
ALTER TABLE t_claim_result ADD PRIMARY KEY (user_id, request_id);

-- 2. The stock ledger of claims, kept in the database of the template's shard: one row per
--    claim whose stock was taken from t_coupon_template_N. The template and the user's coupon
--    often live in different databases, so a claim commits in two steps (stock, then coupon);
--    the ledger makes the stock step idempotent: a claim redelivered after a crash between the
--    two steps finds its row and does not take the stock twice, and a claim whose coupon the
--    database refuses gives the stock back by deleting its row (only the deleting call adds
--    the stock back). Same definition in ds_0 and ds_1.
\ir ../both/0005_claims.sql
