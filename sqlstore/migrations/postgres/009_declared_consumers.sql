CREATE TABLE IF NOT EXISTS {{.DeclaredTable}} (
    topic TEXT NOT NULL,
    consumer TEXT NOT NULL,
    remote BOOLEAN NOT NULL DEFAULT FALSE,
    start_id TEXT NOT NULL,
    declared_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT {{.DeclaredIndex "pkey"}} PRIMARY KEY (topic, consumer)
);
