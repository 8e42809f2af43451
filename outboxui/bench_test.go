package outboxui_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/sqlstore"
)

// BenchmarkPages times the dashboard's pages on PostgreSQL, on a table of
// OUTBOXUI_BENCH_ROWS records (1,000,000 by default) over two days: 98%
// completed (the last 2% in the last hour), 2% pending, 0.1% abandoned, in
// two topics. It asserts nothing about time; docs/operations.md has the
// figures.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./outboxui/
func BenchmarkPages(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("OUTBOXUI_BENCH_ROWS"); s != "" {
		var err error
		rows, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	be := testenv.Backends()[0]
	db := be.Open(b)
	s := testenv.NewStore(b, be, db, sqlstore.Mark)
	fillTable(b, db, s.Table(), rows)

	ui, err := outboxui.New(s, outboxui.Config{}, nil)
	require.NoError(b, err)
	var first int64
	require.NoError(b, db.GetContext(b.Context(), &first, db.Rebind("SELECT MIN(id) FROM "+s.Table()+" WHERE processed_at IS NULL AND topic = 'orders'")))
	for _, page := range []struct{ name, path string }{
		{"Overview", "/"},
		{"PendingList", "/records?topic=orders&state=pending"},
		{"PendingListLastPage", fmt.Sprintf("/records?topic=orders&state=pending&after=%d", first+int64(rows)/60)},
		{"AbandonedList", "/records?topic=payments&state=abandoned"},
		{"Record", fmt.Sprintf("/record?id=%d", first)},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				ui.ServeHTTP(w, httptest.NewRequest(http.MethodGet, page.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d\n%s", page.path, w.Code, w.Body)
				}
			}
		})
	}
}

// fillTable fills a PostgreSQL table with rows records over two days, as
// BenchmarkPages describes, and analyzes it.
func fillTable(tb testing.TB, db *sqlx.DB, table string, rows int) {
	tb.Helper()
	ctx := tb.Context()
	// Ids grow with created_at, as they do in a real table: record i was
	// saved (rows-i) * 172800/rows seconds ago.
	_, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (topic, uuid, payload, metadata, created_at, processed_at, abandoned_at, attempts, last_sent_at)
SELECT CASE WHEN i %% 3 = 0 THEN 'payments' ELSE 'orders' END, 'u-' || i, convert_to('{"n":' || i || '}', 'UTF8'), '{}',
  now() - (($1 - i) * 172800.0 / $1) * interval '1 second',
  CASE WHEN i %% 1000 = 0 THEN now() - interval '10 minutes'
       WHEN i > $1 * 0.98 THEN NULL
       WHEN i > $1 * 0.96 THEN now() - (($1 - i) * 3600.0 / ($1 * 0.04)) * interval '1 second'
       ELSE now() - (($1 - i) * 172800.0 / $1) * interval '1 second' + interval '2 seconds' END,
  CASE WHEN i %% 1000 = 0 THEN now() - interval '10 minutes' END,
  CASE WHEN i %% 50 = 0 THEN 1 ELSE 0 END,
  CASE WHEN i %% 40 = 0 THEN now() - interval '5 minutes' END
FROM generate_series(1, $1) AS i`, table), rows)
	require.NoError(tb, err)
	_, err = db.ExecContext(ctx, "ANALYZE "+table)
	require.NoError(tb, err)
}
