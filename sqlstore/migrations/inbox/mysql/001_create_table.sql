CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer VARBINARY(255) NOT NULL,
    message_uuid VARBINARY(255) NOT NULL,
    business_key VARBINARY(255) NULL DEFAULT NULL,
    source VARCHAR(255) NOT NULL DEFAULT '',
    record_id BIGINT NOT NULL DEFAULT 0,
    handled_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, message_uuid),
    UNIQUE KEY {{.Index "bkey"}} (consumer, business_key),
    KEY {{.Index "handled"}} (handled_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
