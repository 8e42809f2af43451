ALTER TABLE {{.Table}} ADD COLUMN order_key VARBINARY(255) NULL DEFAULT NULL;
ALTER TABLE {{.Table}} ADD KEY {{.Index "order"}} (topic, order_key, id);
