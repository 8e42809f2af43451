ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS last_error TEXT;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS last_sent_at TIMESTAMPTZ;
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS abandoned_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS {{.Index "abandoned"}} ON {{.Table}} (topic, id) WHERE abandoned_at IS NOT NULL{{if .Mark}};
CREATE INDEX IF NOT EXISTS {{.Index "processed"}} ON {{.Table}} (processed_at) WHERE processed_at IS NOT NULL AND abandoned_at IS NULL{{end}};
