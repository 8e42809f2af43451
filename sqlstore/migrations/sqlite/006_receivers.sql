CREATE TABLE IF NOT EXISTS {{.ReceiversTable}} (
    topic TEXT NOT NULL,
    consumer TEXT NOT NULL,
    first_seen_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    PRIMARY KEY (topic, consumer)
) WITHOUT ROWID;
