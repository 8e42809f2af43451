ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS consumers INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS lease_owner TEXT;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS due_at TIMESTAMPTZ;
{{if .Mark}}ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS completed_by TEXT;{{end}}
CREATE TABLE IF NOT EXISTS {{.ConsumersTable}} (
    record_id BIGINT NOT NULL,
    consumer TEXT NOT NULL,
    processed_at TIMESTAMPTZ,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    abandoned_at TIMESTAMPTZ,
    lease_until TIMESTAMPTZ,
    lease_owner TEXT,
    due_at TIMESTAMPTZ,
    CONSTRAINT {{.ConsumersIndex "pkey"}} PRIMARY KEY (record_id, consumer)
);
CREATE INDEX IF NOT EXISTS {{.ConsumersIndex "pending"}} ON {{.ConsumersTable}} (consumer, record_id) WHERE processed_at IS NULL AND abandoned_at IS NULL;
