-- The template's stock buckets (common/coupon/bucket.h). Same definition in ds_0 and ds_1.

\ir ../both/0016_stock_buckets.sql
