CREATE TABLE IF NOT EXISTS {{.Table}} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    uuid TEXT NOT NULL,
    payload BLOB NOT NULL,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')){{if .Mark}},
    processed_at TEXT{{end}}
);
CREATE INDEX IF NOT EXISTS {{.Index "pending"}} ON {{.Table}} (topic, id){{if .Mark}} WHERE processed_at IS NULL{{end}};
