-- Outbox and timers of this database (rules 1 and 2): a row written in the same transaction
-- as the change it announces; the relay publishes rows whose due_at has come, claiming them
-- with FOR UPDATE SKIP LOCKED. due_at = now() for "publish after commit", later for delays.
CREATE TABLE t_outbox (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,              -- routing key
    msg_key    text        NOT NULL,              -- stable key, for consumer idempotency
    payload    jsonb       NOT NULL,
    headers    jsonb       NOT NULL DEFAULT '{}', -- request id, traceparent
    due_at     timestamptz NOT NULL DEFAULT now(),
    status     smallint    NOT NULL DEFAULT 0 CHECK (status IN (0, 1)), -- 0 pending, 1 sent
    attempts   integer     NOT NULL DEFAULT 0,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
CREATE INDEX t_outbox_due_idx ON t_outbox (due_at) WHERE status = 0;
-- cancelling a pending timer by key (a reminder cancelled before it fires)
CREATE INDEX t_outbox_pending_key_idx ON t_outbox (msg_key) WHERE status = 0;
