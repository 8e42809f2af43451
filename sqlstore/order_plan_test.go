package sqlstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestMariaDBReadsTheEarlierRecordsOfAKeyThroughTheOrderIndex: on MariaDB,
// with 5,000 pending records of 1,000 keys in turn, the earlier record of
// each of the last 50 records is found through the order index. Left to
// itself, MariaDB walked the primary key back from each record, reading
// the thousand records in between: about 9,000 rows for 50 records.
func TestMariaDBReadsTheEarlierRecordsOfAKeyThroughTheOrderIndex(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	// One connection, so that the session's counters are the store's.
	db.SetMaxOpenConns(1)
	ctx := testCtx(t)
	s := testenv.NewStore(t, testenv.Backends()[2], db, sqlstore.Delete)
	var ids []int64
	for range 10 {
		recs := make([]recordstore.Record, 500)
		for i := range recs {
			k := strconv.Itoa((len(ids) + i) % 1000)
			recs[i] = recordstore.Record{Topic: "orders", UUID: "u", Payload: []byte("{}"), OrderKey: k, Metadata: map[string]string{"k": k}}
		}
		require.NoError(t, s.Insert(ctx, recs))
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
	}
	last := ids[len(ids)-50:]

	before := rowsRead(ctx, t, db)
	got, err := s.Predecessors(ctx, "orders", last)
	require.NoError(t, err)
	read := rowsRead(ctx, t, db) - before
	for i, id := range last {
		assert.Equal(t, ids[len(ids)-50+i-1000], got[id], "the earlier record of record %d", id)
	}
	assert.Less(t, read, int64(10*len(last)), "rows read for the earlier records of 50 records")
}

// rowsRead is the session's count of rows its handlers read.
func rowsRead(ctx context.Context, t *testing.T, db *sqlx.DB) int64 {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
	require.NoError(t, err)
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name, value string
		require.NoError(t, rows.Scan(&name, &value))
		n, err := strconv.ParseInt(value, 10, 64)
		require.NoError(t, err)
		total += n
	}
	require.NoError(t, rows.Err())
	return total
}
