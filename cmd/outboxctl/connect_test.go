package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
)

// TestMissingSQLiteFile never creates the file a DSN names.
func TestMissingSQLiteFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	abs := filepath.Join(dir, "abs.db")
	for _, tc := range []struct{ dsn, file string }{
		{"missing.db", "missing.db"},
		{"file:missing.db", "missing.db"},
		{"file:missing.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", "missing.db"},
		{"missing.db?_pragma=busy_timeout(5000)", "missing.db"},
		{"file:missing.sqlite?mode=rwc", "missing.sqlite"},
		{"file://" + abs, abs},
	} {
		r := outboxctl(t, dir, nil, "-dsn", tc.dsn, "status")
		assert.Equal(t, 1, r.code, tc.dsn)
		assert.Equal(t, `outboxctl: sqlite database file "`+tc.file+`" does not exist (outboxctl never creates one; check -dsn)`+"\n", r.stderr, tc.dsn)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, entries, "%s: no file is created", tc.dsn)
	}
}

// TestConnectionErrors says "cannot connect" with the server and never the
// password, and keeps the Migrate hint for a table that is missing.
func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, stderr string }{
		{"postgres://app:s3cret@127.0.0.1:1/test?sslmode=disable&password=s3cret", "outboxctl: cannot connect to postgres at postgres://app@127.0.0.1:1/test: "},
		{"app:s3cret@tcp(127.0.0.1:1)/test?interpolateParams=true", "outboxctl: cannot connect to mysql at app@tcp(127.0.0.1:1)/test: "},
	} {
		r := outboxctl(t, "", nil, "-dsn", tc.dsn, "status")
		assert.Equal(t, 1, r.code, tc.dsn)
		assert.Contains(t, r.stderr, tc.stderr)
		assert.Contains(t, r.stderr, "connection refused")
		assert.NotContains(t, r.stderr, "s3cret")
		assert.NotContains(t, r.stderr, "Migrate")
	}
	r := outboxctl(t, "", nil, "-dialect", "postgres", "-dsn", "host=127.0.0.1 port=1 user=app password=s3cret dbname=test", "status")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "outboxctl: cannot connect to postgres at host=127.0.0.1 port=1 user=app dbname=test: ")
	assert.NotContains(t, r.stderr, "s3cret")

	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)
		r := outboxctl(t, "", nil, "-dsn", f.dsn, "-table", "no_such_table", "status")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stderr, `table "no_such_table" (`+b.Dialect.Name()+`, database `)
		assert.Contains(t, r.stderr, "table does not exist; create it with Store.Migrate")
		assert.NotContains(t, r.stderr, "cannot connect")
	})
}
