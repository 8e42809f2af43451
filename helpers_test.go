package outbox_test

import (
	"fmt"

	"github.com/wmoutbox/outbox/internal/testenv"
)

func fmtSscan(s string, id *int64) (int, error) { return fmt.Sscan(s, id) }

// castNow reads the database clock as text comparable with castProcessed.
func castNow(b testenv.Backend) string { return b.Features.Now }

func castProcessed(b testenv.Backend, table string) string { return b.Features.ProcessedAt(table) }
