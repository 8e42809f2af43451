ALTER TABLE {{.Table}} ADD COLUMN origin VARBINARY(255) NULL DEFAULT NULL;
ALTER TABLE {{.Table}} ADD UNIQUE KEY {{.Index "origin"}} (origin);
