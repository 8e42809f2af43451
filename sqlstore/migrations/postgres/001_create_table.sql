{{if .Partitioned}}CREATE SEQUENCE IF NOT EXISTS {{.Sequence}};
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id BIGINT NOT NULL DEFAULT nextval('{{.Sequence}}'),
    topic TEXT NOT NULL,
    uuid TEXT NOT NULL,
    payload BYTEA NOT NULL,
    metadata JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at TIMESTAMPTZ,
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
ALTER SEQUENCE {{.Sequence}} OWNED BY {{.Table}}.id;
CREATE TABLE IF NOT EXISTS {{.FirstPartition}} PARTITION OF {{.Table}} FOR VALUES FROM (MINVALUE) TO ({{.PartitionSpan}});
{{else}}CREATE TABLE IF NOT EXISTS {{.Table}} (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic TEXT NOT NULL,
    uuid TEXT NOT NULL,
    payload BYTEA NOT NULL,
    metadata JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(){{if .Mark}},
    processed_at TIMESTAMPTZ{{end}}
);
{{end}}CREATE INDEX IF NOT EXISTS {{.Index "pending"}} ON {{.Table}} (topic, id){{if .Mark}} WHERE processed_at IS NULL{{end}};
