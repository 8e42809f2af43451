package outbox_test

import (
	"fmt"

	"github.com/wmoutbox/outbox/internal/testenv"
)

func fmtSscan(s string, id *int64) (int, error) { return fmt.Sscan(s, id) }

// castNow reads the database clock as text comparable with castProcessed.
func castNow(b testenv.Backend) string {
	if b.Name == "SQLite" {
		return b.Now
	}
	return "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
}

func castProcessed(b testenv.Backend, table string) string {
	if b.Name == "SQLite" {
		return "SELECT processed_at FROM " + table + " WHERE id = ?"
	}
	return "SELECT to_char(processed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM " + table + " WHERE id = ?"
}
