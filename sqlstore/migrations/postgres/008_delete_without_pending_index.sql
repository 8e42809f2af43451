{{if not .Mark}}DROP INDEX IF EXISTS {{.QualifiedIndex "pending"}};{{end}}
