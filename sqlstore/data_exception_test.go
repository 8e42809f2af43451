package sqlstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestDataExceptionsAreInvalidValues: each database's own refusal of a
// value (a data exception) is converted into an error wrapping
// recordstore.ErrInvalidValue, and a refused statement is not.
func TestDataExceptionsAreInvalidValues(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		ctx := testCtx(t)
		conn, err := b.Open(t).Connx(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		var refused error
		switch b.Name {
		case "Postgres":
			_, refused = conn.ExecContext(ctx, "SELECT $1::int", "one")
		case "MariaDB":
			_, err = conn.ExecContext(ctx, "CREATE TEMPORARY TABLE short_text (v VARCHAR(2))")
			require.NoError(t, err)
			_, refused = conn.ExecContext(ctx, "INSERT INTO short_text VALUES (?)", "abc")
		case "SQLite":
			_, refused = conn.ExecContext(ctx, "SELECT zeroblob(?)", 2_000_000_000)
		}
		require.Error(t, refused)
		assert.ErrorIs(t, sqlstore.ConvertError(b.Dialect, refused), recordstore.ErrInvalidValue, "%v", refused)
		_, syntax := conn.ExecContext(ctx, "SELEC 1")
		require.Error(t, syntax)
		assert.NotErrorIs(t, sqlstore.ConvertError(b.Dialect, syntax), recordstore.ErrInvalidValue)
	})
}

// TestPostgresInAnotherEncoding: on a PostgreSQL database in LATIN1, whose
// connections speak UTF-8, the server refuses characters the encoding lacks
// ("€"), which the store cannot know of beforehand; the database's refusal
// is an invalid value:
// the inbox refuses such an entry with ErrInvalidEntry, a check whose
// claim sends a message UUID the database refuses reports another
// message's, and a check or a completion combined with other calls' fails
// for its own call only.
func TestPostgresInAnotherEncoding(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[0]
	db := latin1Postgres(t)
	ctx := testCtx(t)
	const euro = "\u20ac"

	in := newInbox(t, b, db)
	e := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "order-1", BusinessKey: euro}
	_, err := in.Handled(ctx, e)
	assert.ErrorIs(t, err, recordstore.ErrInvalidEntry)
	assert.ErrorIs(t, in.MarkHandled(ctx, e), recordstore.ErrInvalidEntry)

	store, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db, Table: testenv.Table(t), Coalescing: oneInFlight})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	c := &coalescing{backend: b, db: db, store: store}
	recs := records("a", "b", "c", "d", "e")
	require.NoError(t, store.Insert(ctx, recs))
	of := func(r recordstore.Record, consumer, uuid string) recordstore.Delivery {
		return recordstore.Delivery{ID: r.ID, Topic: r.Topic, Consumer: consumer, UUID: uuid}
	}

	t.Run("LeaseClaim", func(t *testing.T) {
		leased, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, DB: db, Table: testenv.Table(t), Lease: time.Minute})
		require.NoError(t, err)
		require.NoError(t, leased.Migrate(ctx))
		r := records("one")
		require.NoError(t, leased.Insert(ctx, r))
		assert.ErrorIs(t, leased.CheckPending(ctx, of(r[0], "handler", euro)), recordstore.ErrMessageMismatch)
		assert.NoError(t, leased.CheckPending(ctx, of(r[0], "handler", r[0].UUID)), "the record's own message claims it")
	})

	t.Run("CombinedChecks", func(t *testing.T) {
		watch := sqlstore.WatchChecks(store)
		require.NotNil(t, watch, "checks are combined on PostgreSQL")
		release := c.blockReads(t)
		first := checkAsync(ctx, store, of(recs[0], "handler", recs[0].UUID))
		require.NoError(t, watch.Wait(ctx, 1, 0))
		good := checkAsync(ctx, store, of(recs[1], "handler", recs[1].UUID))
		bad := checkAsync(ctx, store, of(recs[2], euro, recs[2].UUID))
		require.NoError(t, watch.Wait(ctx, 1, 2))
		release()
		assert.NoError(t, <-first)
		assert.NoError(t, <-good, "the other call of the batch is answered")
		assert.ErrorIs(t, <-bad, recordstore.ErrInvalidValue)
	})

	t.Run("CombinedCompletions", func(t *testing.T) {
		watch := sqlstore.WatchCompletes(store)
		release := c.blockWrites(t)
		first := completeDeliveryAsync(ctx, store, of(recs[0], "handler", recs[0].UUID))
		require.NoError(t, watch.Wait(ctx, 1, 0))
		good := completeDeliveryAsync(ctx, store, of(recs[3], "handler", recs[3].UUID))
		bad := completeDeliveryAsync(ctx, store, of(recs[4], "handler", euro))
		require.NoError(t, watch.Wait(ctx, 1, 2))
		release()
		assert.NoError(t, <-first)
		assert.NoError(t, <-good, "the other call of the batch completes")
		assert.ErrorIs(t, <-bad, recordstore.ErrInvalidValue)
		assert.NoError(t, store.CheckPending(ctx, of(recs[4], "handler", recs[4].UUID)), "the refused call completed nothing")
	})
}

func checkAsync(ctx context.Context, s *sqlstore.Store, d recordstore.Delivery) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.CheckPending(ctx, d) }()
	return done
}

func completeDeliveryAsync(ctx context.Context, s *sqlstore.Store, d recordstore.Delivery) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, d) }()
	return done
}

// latin1Postgres creates a PostgreSQL database in the LATIN1 encoding,
// drops it when the test ends, and returns a pool on it whose connections
// speak UTF-8 (client_encoding), as an application's should.
func latin1Postgres(t *testing.T) *sqlx.DB {
	t.Helper()
	ctx := testCtx(t)
	admin := testenv.Postgres(t)
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	name := "outbox_latin1_" + hex.EncodeToString(suffix[:])
	_, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
	require.NoError(t, err)
	dsn, err := url.Parse(testenv.PostgresDSN())
	require.NoError(t, err)
	dsn.Path = "/" + name
	q := dsn.Query()
	q.Set("client_encoding", "UTF8")
	dsn.RawQuery = q.Encode()
	db := testenv.Open(t, "PostgreSQL", "pgx", dsn.String())
	t.Cleanup(func() {
		_ = db.Close()
		_, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		assert.NoError(t, err)
	})
	return db
}
