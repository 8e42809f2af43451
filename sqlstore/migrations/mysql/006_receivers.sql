CREATE TABLE IF NOT EXISTS {{.ReceiversTable}} (
    topic VARBINARY(512) NOT NULL,
    consumer VARBINARY(512) NOT NULL,
    first_seen_at DATETIME(6) NOT NULL,
    last_seen_at DATETIME(6) NOT NULL,
    PRIMARY KEY (topic, consumer)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
