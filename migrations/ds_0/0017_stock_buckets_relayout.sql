-- A change of a live template's stock buckets under way (common/coupon/bucket.h). Same
-- definition in ds_0 and ds_1.

\ir ../both/0017_stock_buckets_relayout.sql
