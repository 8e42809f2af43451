ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS origin TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "origin"}} ON {{.Table}} (origin) WHERE origin IS NOT NULL;
