-- The failure report is read page by page in row order (row_num, then id) after the key of
-- the last row sent: an index in that order makes each page a range scan, whatever the size
-- of the report.
CREATE INDEX t_coupon_task_fail_report_idx ON t_coupon_task_fail (task_id, row_num, id);
