ALTER TABLE {{.Table}} ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table}} ADD COLUMN last_error TEXT;
ALTER TABLE {{.Table}} ADD COLUMN last_sent_at TEXT;
ALTER TABLE {{.Table}} ADD COLUMN abandoned_at TEXT;
CREATE INDEX IF NOT EXISTS {{.Index "abandoned"}} ON {{.Table}} (topic, id) WHERE abandoned_at IS NOT NULL{{if .Mark}};
CREATE INDEX IF NOT EXISTS {{.Index "processed"}} ON {{.Table}} (processed_at) WHERE processed_at IS NOT NULL AND abandoned_at IS NULL{{end}};
