CREATE TABLE IF NOT EXISTS {{.Table}} (
    id BIGINT NOT NULL AUTO_INCREMENT,
    topic VARBINARY(512) NOT NULL,
    uuid TEXT NOT NULL,
    payload LONGBLOB NOT NULL,
    metadata JSON NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)){{if .Mark}},
    processed_at DATETIME(6) NULL DEFAULT NULL{{end}},
    PRIMARY KEY (id),
    KEY {{.Index "pending"}} (topic, {{if .Mark}}processed_at, {{end}}id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
