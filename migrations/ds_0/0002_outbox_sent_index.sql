\ir ../both/0002_outbox_sent_index.sql
