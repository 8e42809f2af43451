ALTER TABLE {{.Table}}
    ADD COLUMN attempts INT NOT NULL DEFAULT 0,
    ADD COLUMN last_error TEXT NULL DEFAULT NULL,
    ADD COLUMN last_sent_at DATETIME(6) NULL DEFAULT NULL,
    ADD COLUMN abandoned_at DATETIME(6) NULL DEFAULT NULL;
ALTER TABLE {{.Table}} ADD KEY {{.Index "abandoned"}} (topic, abandoned_at, id);
{{if .Mark}}ALTER TABLE {{.Table}} ADD KEY {{.Index "processed"}} (processed_at);{{end}}
