package sqlstore_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Values some database cannot keep.
var (
	withNUL  = "a\x00b"
	notUTF8  = "a\xffb"
	longName = strings.Repeat("n", 513)
)

// refusals are the values each database refuses before any statement is
// sent: names (topics, consumers, the inbox's keys) and text (a message
// UUID, an inbox's source).
var refusals = map[string]struct{ names, text []string }{
	"Postgres": {names: []string{withNUL, notUTF8}, text: []string{withNUL, notUTF8}},
	"MariaDB":  {names: []string{longName}, text: []string{notUTF8}},
	"SQLite":   {},
}

// TestValuesEachDatabaseCannotKeep: on one store and one inbox per
// database, a delivery whose consumer (the handler's name) the table cannot
// keep is refused by every operation with an error wrapping
// recordstore.ErrInvalidValue, before any statement is sent, so that a
// caller's transaction stays usable; one the table keeps is tracked as any
// other. An error text is counted whatever its bytes, kept with what the
// database cannot keep replaced. An inbox entry is refused with
// ErrInvalidEntry exactly when a field has what its column cannot keep.
func TestValuesEachDatabaseCannotKeep(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		rules := refusals[b.Name]
		db := b.Open(t)
		store := testenv.NewStore(t, b, db, sqlstore.Mark)
		for _, consumer := range []string{withNUL, notUTF8, longName} {
			refused := slices.Contains(rules.names, consumer)
			want := func(t *testing.T, err error, op string) {
				t.Helper()
				if refused {
					assert.ErrorIs(t, err, recordstore.ErrInvalidValue, "%s, consumer %.8q", op, consumer)
				} else {
					assert.NoError(t, err, "%s, consumer %.8q", op, consumer)
				}
			}
			recs := []recordstore.Record{{Topic: "orders", UUID: "u1"}, {Topic: "orders", UUID: "u2"}}
			require.NoError(t, store.Insert(ctx, recs))
			d := recordstore.Delivery{ID: recs[0].ID, Topic: "orders", Consumer: consumer, UUID: "u1"}
			want(t, store.CheckPending(ctx, d), "check")
			_, _, err := store.RecordFailure(ctx, d, "boom", 0, nil)
			want(t, err, "failure")
			want(t, store.Complete(ctx, d), "completion")

			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			want(t, store.CompleteTx(ctx, tx, recordstore.Delivery{ID: recs[1].ID, Topic: "orders", Consumer: consumer, UUID: "u2"}), "completion in a transaction")
			_, err = tx.ExecContext(ctx, "SELECT 1")
			assert.NoError(t, err, "the transaction stays usable")
			require.NoError(t, tx.Commit())
		}

		id := insertOne(t, store)
		_, _, err := store.RecordFailure(ctx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: "handler"}, "boom \x00 \xff", 0, nil)
		require.NoError(t, err)
		var kept string
		require.NoError(t, db.GetContext(ctx, &kept, db.Rebind("SELECT last_error FROM "+store.Table()+" WHERE id = ?"), id))
		assert.Equal(t, map[string]string{"Postgres": "boom \uFFFD \uFFFD", "MariaDB": "boom \x00 \uFFFD", "SQLite": "boom \x00 \xff"}[b.Name], kept)

		in := newInbox(t, b, db)
		for j, v := range []string{withNUL, notUTF8} {
			for i, field := range []string{"Consumer", "MessageUUID", "BusinessKey", "Source"} {
				key := fmt.Sprintf("%d-%d", j, i)
				e := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m-" + key, BusinessKey: "k-" + key, Source: "s"}
				*[]*string{&e.Consumer, &e.MessageUUID, &e.BusinessKey, &e.Source}[i] = v
				rule := rules.names
				if field == "Source" {
					rule = rules.text
				}
				err := in.MarkHandled(ctx, e)
				if slices.Contains(rule, v) {
					assert.ErrorIs(t, err, recordstore.ErrInvalidEntry, "%s %q", field, v)
					assert.ErrorIs(t, err, recordstore.ErrInvalidValue, "%s %q", field, v)
				} else {
					assert.NoError(t, err, "%s %q", field, v)
				}
			}
		}
	})
}

func insertOne(t *testing.T, store *sqlstore.Store) int64 {
	t.Helper()
	recs := []recordstore.Record{{Topic: "orders", UUID: "one"}}
	require.NoError(t, store.Insert(testCtx(t), recs))
	return recs[0].ID
}
