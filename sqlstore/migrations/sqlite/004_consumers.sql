ALTER TABLE {{.Table}} ADD COLUMN consumers INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table}} ADD COLUMN lease_owner TEXT;
ALTER TABLE {{.Table}} ADD COLUMN due_at TEXT;
{{if .Mark}}ALTER TABLE {{.Table}} ADD COLUMN completed_by TEXT;{{end}}
CREATE TABLE IF NOT EXISTS {{.ConsumersTable}} (
    record_id INTEGER NOT NULL,
    consumer TEXT NOT NULL,
    processed_at TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    abandoned_at TEXT,
    lease_until TEXT,
    lease_owner TEXT,
    due_at TEXT,
    PRIMARY KEY (record_id, consumer)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{.ConsumersIndex "pending"}} ON {{.ConsumersTable}} (consumer, record_id) WHERE processed_at IS NULL AND abandoned_at IS NULL;
