package sqlstore_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestInboxQueriesUseTheIndexes: on PostgreSQL, in an inbox of many
// entries, Handled finds an entry through the primary key and, with a
// business key, the business key index (a bitmap OR of the two), and Clean
// picks the oldest entries through the handled_at index and deletes them by
// ctid, and Recent reads the latest through the handled_at index, in the generic plan that PostgreSQL caches for a prepared statement
// too. Matched by key, the delete hash-joined them with a scan of the whole
// table.
func TestInboxQueriesUseTheIndexes(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[0]
	require.Equal(t, "Postgres", b.Name)
	db := b.Open(t)
	ctx := testCtx(t)
	in := newInbox(t, b, db)
	_, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, message_uuid, business_key, handled_at)
SELECT 'c' || (i %% 10), 'm' || i, CASE WHEN i %% 2 = 0 THEN 'k' || i END, now() - i * interval '1 second'
FROM generate_series(1, 20000) AS i`, in.Table()))
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "ANALYZE "+in.Table())
	require.NoError(t, err)

	handled, handledUUID, clean := sqlstore.InboxStatements(in)
	table := strings.Trim(in.Table(), `"`)
	for _, tc := range []struct {
		name, query, types, args string
		want                     []string
	}{
		{"Handled", handled, "text, text, text, text", "'c1', 'm11', 'k12', 'm11'", []string{table + "_pkey", table + "_bkey"}},
		{"HandledWithoutBusinessKey", handledUUID, "text, text", "'c1', 'm11'", []string{table + "_pkey"}},
		{"Clean", clean, "bigint, bigint", "3600000000, 100", []string{table + "_handled", "Tid Scan"}},
		{"Recent", sqlstore.InboxRecentStatement(in), "bigint", "50", []string{"Index Scan Backward using " + table + "_handled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := genericPlan(t, db, tc.query, tc.types, tc.args)
			for _, index := range tc.want {
				assert.Contains(t, text, index, text)
			}
			assert.NotContains(t, text, "Seq Scan on "+table, text)
		})
	}
}
