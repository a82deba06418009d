-- The restore epoch: how many times this database was restored from a backup (backup.sh, or
-- `quan-recover --restored` after an operator's own restore), and the last epoch quan-recover
-- brought Redis, the queues and the engines back in line with. While the two differ, engines
-- answer claims 503: Redis and the broker describe a future this database no longer holds.
CREATE TABLE quan_restore (
    id              int PRIMARY KEY CHECK (id = 1),
    epoch           bigint NOT NULL DEFAULT 0,
    recovered_epoch bigint NOT NULL DEFAULT 0,
    restored_at     timestamptz,
    recovered_at    timestamptz
);
INSERT INTO quan_restore (id) VALUES (1);
