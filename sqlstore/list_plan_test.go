package sqlstore_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestListByTopicPagesThroughTheIndexes: on PostgreSQL, with a table of many
// completed records, the dashboard's pages of a topic's pending or
// abandoned records, and of a consumer's pending deliveries, read through
// the partial indexes, never a scan of the table.
func TestListByTopicPagesThroughTheIndexes(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := testCtx(t)
	s := testenv.NewStore(t, testenv.Backends()[0], db, sqlstore.Mark)
	_, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (topic, uuid, payload, metadata, processed_at, abandoned_at)
SELECT 'orders', 'u', '\x00', '{}', CASE WHEN i % 100 <> 0 THEN now() END, CASE WHEN i % 1000 = 0 THEN now() END
FROM generate_series(1, 50000) AS i`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO `+s.Table()+`_consumers (record_id, consumer) SELECT id, 'ship' FROM `+s.Table()+` WHERE processed_at IS NULL`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "ANALYZE "+s.Table()+"; ANALYZE "+s.Table()+"_consumers")
	require.NoError(t, err)
	pending, abandoned, consumer := sqlstore.TopicListStatements(s)
	for _, c := range []struct {
		name, query, index string
		args               []any
	}{
		{"Pending", pending, "_pending", []any{"orders", 0, 50}},
		{"Abandoned", abandoned, "_abandoned", []any{"orders", 0, 50}},
		{"ConsumerPending", consumer, "_c_pending", []any{"ship", "orders", 0, 50}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var plan []string
			require.NoError(t, db.SelectContext(ctx, &plan, "EXPLAIN "+c.query, c.args...))
			text := strings.Join(plan, "\n")
			assert.Contains(t, text, c.index, text)
			assert.NotContains(t, text, "Seq Scan", text)
		})
	}
}
