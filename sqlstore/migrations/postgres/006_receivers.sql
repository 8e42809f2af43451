CREATE TABLE IF NOT EXISTS {{.ReceiversTable}} (
    topic TEXT NOT NULL,
    consumer TEXT NOT NULL,
    first_seen_at TIMESTAMPTZ NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT {{.ReceiversIndex "pkey"}} PRIMARY KEY (topic, consumer)
);
