ALTER TABLE {{.Table}} ADD COLUMN order_key TEXT;
CREATE INDEX IF NOT EXISTS {{.Index "order"}} ON {{.Table}} (topic, order_key, id) WHERE order_key IS NOT NULL{{if .Mark}} AND (processed_at IS NULL OR abandoned_at IS NOT NULL){{end}};
