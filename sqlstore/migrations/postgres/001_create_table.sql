CREATE TABLE IF NOT EXISTS {{.Table}} (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic TEXT NOT NULL,
    uuid TEXT NOT NULL,
    payload BYTEA NOT NULL,
    metadata JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(){{if .Mark}},
    processed_at TIMESTAMPTZ{{end}}
);
CREATE INDEX IF NOT EXISTS {{.Index "pending"}} ON {{.Table}} (topic, id){{if .Mark}} WHERE processed_at IS NULL{{end}};
