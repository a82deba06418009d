-- Archive tables of dead coupons beside each coupon shard, the archiver's index, and the
-- issue trigger that a restore from the archive leaves alone (services/engine/archive.h).
-- Same definition in ds_0 and ds_1.

\ir ../both/0015_coupon_archive.sql
