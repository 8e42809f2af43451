CREATE TABLE IF NOT EXISTS {{.DeclaredTable}} (
    topic VARBINARY(512) NOT NULL,
    consumer VARBINARY(512) NOT NULL,
    remote BOOLEAN NOT NULL DEFAULT FALSE,
    start_id VARBINARY(64) NOT NULL,
    declared_at DATETIME(6) NOT NULL,
    PRIMARY KEY (topic, consumer)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
