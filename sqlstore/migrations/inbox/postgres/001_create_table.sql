CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer TEXT NOT NULL,
    message_uuid TEXT NOT NULL,
    business_key TEXT,
    source TEXT NOT NULL DEFAULT '',
    record_id BIGINT NOT NULL DEFAULT 0,
    handled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT {{.Index "pkey"}} PRIMARY KEY (consumer, message_uuid)
);
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "bkey"}} ON {{.Table}} (consumer, business_key);
CREATE INDEX IF NOT EXISTS {{.Index "handled"}} ON {{.Table}} (handled_at);
