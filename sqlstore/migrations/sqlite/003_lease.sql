ALTER TABLE {{.Table}} ADD COLUMN lease_until TEXT;
