-- Claims (engine claim.c): the stock ledger of claims, kept in the database of the template's
-- shard (see migrations/ds_0/0005_claims.sql for why). Same definition in ds_0 and ds_1.
\ir ../both/0005_claims.sql
