ALTER TABLE {{.Table}}
    ADD COLUMN consumers INT NOT NULL DEFAULT 0,
    ADD COLUMN lease_owner VARBINARY(255) NULL DEFAULT NULL,
    ADD COLUMN due_at DATETIME(6) NULL DEFAULT NULL{{if .Mark}},
    ADD COLUMN completed_by VARBINARY(512) NULL DEFAULT NULL{{end}};
CREATE TABLE IF NOT EXISTS {{.ConsumersTable}} (
    record_id BIGINT NOT NULL,
    consumer VARBINARY(512) NOT NULL,
    processed_at DATETIME(6) NULL DEFAULT NULL,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT NULL DEFAULT NULL,
    abandoned_at DATETIME(6) NULL DEFAULT NULL,
    lease_until DATETIME(6) NULL DEFAULT NULL,
    lease_owner VARBINARY(255) NULL DEFAULT NULL,
    due_at DATETIME(6) NULL DEFAULT NULL,
    PRIMARY KEY (record_id, consumer),
    KEY {{.ConsumersIndex "pending"}} (consumer, processed_at, abandoned_at, record_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
