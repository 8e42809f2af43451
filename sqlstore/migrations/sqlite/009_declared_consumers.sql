CREATE TABLE IF NOT EXISTS {{.DeclaredTable}} (
    topic TEXT NOT NULL,
    consumer TEXT NOT NULL,
    remote INTEGER NOT NULL DEFAULT 0,
    start_id TEXT NOT NULL,
    declared_at TEXT NOT NULL,
    PRIMARY KEY (topic, consumer)
) WITHOUT ROWID;
