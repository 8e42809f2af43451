package storetest

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// clockLayout parses what Features.Now and Features.ProcessedAt return.
const clockLayout = "2006-01-02 15:04:05.999999999"

// longAgo is [LongAgo] as text every database reads the same way.
const longAgo = "2000-01-01 00:00:00"

// sqlInspector is the [Inspector] of sqlstore's stores: it reads and
// writes their tables directly.
type sqlInspector struct{ f Features }

var _ Inspector = sqlInspector{}

func sqlStore(t testing.TB, store recordstore.Store) *sqlstore.Store {
	t.Helper()
	s, ok := store.(*sqlstore.Store)
	require.True(t, ok, "a %T is not a *sqlstore.Store", store)
	return s
}

func (sqlInspector) IDs(t testing.TB, store recordstore.Store) map[string]int64 {
	t.Helper()
	return rowIDs(t, sqlStore(t, store))
}

func (in sqlInspector) Record(t testing.TB, store recordstore.Store, id int64) (Stored, bool) {
	t.Helper()
	s := sqlStore(t, store)
	db := s.DB()
	state := "CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' ELSE 'pending' END"
	if s.Completion() == sqlstore.Mark {
		state = "CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' WHEN processed_at IS NOT NULL THEN 'completed' ELSE 'pending' END"
	}
	var st Stored
	err := db.QueryRowContext(ctx(t), db.Rebind("SELECT "+state+", attempts, COALESCE(last_error, '') FROM "+s.Table()+" WHERE id = ?"), id).
		Scan(&st.State, &st.Attempts, &st.LastError)
	if err == sql.ErrNoRows {
		return Stored{}, false
	}
	require.NoError(t, err)
	if s.Completion() == sqlstore.Mark {
		var at sql.NullString
		require.NoError(t, db.GetContext(ctx(t), &at, db.Rebind(in.f.ProcessedAt(s.Table())), id))
		if at.Valid {
			st.CompletedAt = parseClock(t, at.String)
		}
	}
	return st, true
}

func (sqlInspector) Deliveries(t testing.TB, store recordstore.Store, id int64) []StoredDelivery {
	t.Helper()
	s := sqlStore(t, store)
	db := s.DB()
	rows, err := db.QueryContext(ctx(t), db.Rebind(`SELECT consumer,
    CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' WHEN processed_at IS NOT NULL THEN 'completed' ELSE 'pending' END,
    attempts, COALESCE(last_error, '')
FROM `+s.Table()+`_consumers WHERE record_id = ? ORDER BY consumer`), id)
	require.NoError(t, err)
	defer rows.Close()
	var out []StoredDelivery
	for rows.Next() {
		var d StoredDelivery
		require.NoError(t, rows.Scan(&d.Consumer, &d.State, &d.Attempts, &d.LastError))
		out = append(out, d)
	}
	require.NoError(t, rows.Err())
	return out
}

func (sqlInspector) Remove(t testing.TB, store recordstore.Store, id int64) {
	t.Helper()
	s := sqlStore(t, store)
	db := s.DB()
	_, err := db.ExecContext(ctx(t), db.Rebind("DELETE FROM "+s.Table()+" WHERE id = ?"), id)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx(t), db.Rebind("DELETE FROM "+s.Table()+"_consumers WHERE record_id = ?"), id)
	require.NoError(t, err)
}

func (sqlInspector) Backdate(t testing.TB, store recordstore.Store, m Moment, ids ...int64) {
	t.Helper()
	s := sqlStore(t, store)
	switch m {
	case SavedAt:
		backdate(t, s, "created_at", ids...)
	case SentAt:
		backdate(t, s, "last_sent_at", ids...)
	case CompletedAt:
		backdate(t, s, "processed_at", ids...)
	case DueAt:
		backdate(t, s, "due_at", ids...)
		backdateTable(t, s, s.Table()+"_consumers", "record_id", "due_at", ids...)
	default:
		t.Fatalf("unknown moment %d", m)
	}
}

func (in sqlInspector) Now(t testing.TB, store recordstore.Store) time.Time {
	t.Helper()
	var now string
	require.NoError(t, sqlStore(t, store).DB().GetContext(ctx(t), &now, in.f.Now))
	return parseClock(t, now)
}

func parseClock(t testing.TB, text string) time.Time {
	t.Helper()
	at, err := time.Parse(clockLayout, text)
	require.NoError(t, err, "the database clock as text")
	return at
}

// backdate sets a timestamp column of the given records (all when ids is
// empty) to longAgo.
func backdate(t testing.TB, store *sqlstore.Store, column string, ids ...int64) {
	t.Helper()
	backdateTable(t, store, store.Table(), "id", column, ids...)
}

func backdateTable(t testing.TB, store *sqlstore.Store, table, idColumn, column string, ids ...int64) {
	t.Helper()
	q := "UPDATE " + table + " SET " + column + " = ?"
	args := []any{longAgo}
	if len(ids) > 0 {
		q += " WHERE " + idColumn + " IN (?" + strings.Repeat(",?", len(ids)-1) + ")"
		for _, id := range ids {
			args = append(args, id)
		}
	}
	_, err := store.DB().ExecContext(ctx(t), store.DB().Rebind(q), args...)
	require.NoError(t, err)
}
