ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS origin TEXT;
{{if .Partitioned}}CREATE UNIQUE INDEX IF NOT EXISTS {{.FirstPartitionIndex "origin"}} ON {{.FirstPartition}} (origin) WHERE origin IS NOT NULL;
{{else}}CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "origin"}} ON {{.Table}} (origin) WHERE origin IS NOT NULL;
{{end}}
