-- The outbox relay's periodic cleanup deletes sent rows older than the retention, oldest
-- first, in small chunks; without this index each pass would scan the whole table.
CREATE INDEX t_outbox_sent_idx ON t_outbox (sent_at) WHERE status = 1;
