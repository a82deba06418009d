\ir ../both/0010_claim_void.sql
