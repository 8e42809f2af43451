package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestPublisher(t *testing.T) {
	t.Parallel()

	t.Run("StampsMetadataAndPreservesMessage", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
			defer gc.Close()
			sub, err := gc.Subscribe(b.ctx(t), b.topic)
			require.NoError(t, err)
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)

			msg := message.NewMessage("uuid-1", []byte{0, 1, 2, 255})
			msg.Metadata.Set("trace", "abc")
			require.NoError(t, pub.Publish(b.topic, msg))

			got := <-sub
			got.Ack()
			assert.Equal(t, "uuid-1", got.UUID)
			assert.Equal(t, []byte{0, 1, 2, 255}, []byte(got.Payload))
			assert.Equal(t, "abc", got.Metadata.Get("trace"))
			assert.Equal(t, b.topic, got.Metadata.Get(outbox.MetadataTopic))
			id, err := strconv.ParseInt(got.Metadata.Get(outbox.MetadataID), 10, 64)
			require.NoError(t, err)

			recs, err := b.store.PendingAfter(b.ctx(t), b.topic, 0, 10)
			require.NoError(t, err)
			require.Len(t, recs, 1)
			assert.Equal(t, id, recs[0].ID)
			assert.Equal(t, "uuid-1", recs[0].UUID)
			assert.Equal(t, []byte{0, 1, 2, 255}, recs[0].Payload)
			assert.Equal(t, message.Metadata{"trace": "abc"}, recs[0].Metadata, "the record keeps the metadata as published, without outbox keys")
		})
	})

	t.Run("BatchIDsAreTheRowsIDsInOrder", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			got := b.publishTracked(t, 50)
			byUUID := map[string]int64{}
			for _, m := range got {
				id, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataID), 10, 64)
				require.NoError(t, err)
				byUUID[m.UUID] = id
			}
			var rows []struct {
				ID   int64  `db:"id"`
				UUID string `db:"uuid"`
			}
			require.NoError(t, b.db.SelectContext(b.ctx(t), &rows, "SELECT id, uuid FROM "+b.store.Table()+" ORDER BY id"))
			require.Len(t, rows, 50)
			for _, r := range rows {
				assert.Equal(t, r.ID, byUUID[r.UUID], "message %s carries the id of its own row", r.UUID)
			}
		})
	})

	t.Run("InsertFailureSendsNothing", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			db := backend.Open(t)
			// A table that was never created: the insert fails in the database.
			store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: testenv.Table(t), DB: db})
			require.NoError(t, err)
			reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
			require.NoError(t, err)
			raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
			defer raw.Close()
			pub, err := outbox.NewPublisher(reg, raw)
			require.NoError(t, err)

			err = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x")))
			var insErr *outbox.InsertError
			require.ErrorAs(t, err, &insErr)
			assert.ErrorIs(t, err, sqlstore.ErrTableMissing)
			assert.Contains(t, err.Error(), store.Table())
			calls, _ := raw.counts()
			assert.Zero(t, calls, "nothing may be sent when the record was not saved")
		})
	})

	t.Run("SendFailureLeavesRecordsPending", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			require.NoError(t, gc.Close())
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)

			err = pub.Publish(b.topic, message.NewMessage("a", nil), message.NewMessage("b", nil))
			var sendErr *outbox.SendError
			require.ErrorAs(t, err, &sendErr)
			assert.Len(t, sendErr.IDs, 2)
			for _, id := range sendErr.IDs {
				assert.NoError(t, b.store.CheckPending(b.ctx(t), b.delivery(id)))
			}
			assert.Equal(t, 2, b.pendingCount(t))
		})
	})

	t.Run("ConcurrentPublishersGetTheirOwnIDsInOrder", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			const publishers, each = 16, 20
			sent := make([][]*message.Message, publishers)
			errs := make(chan error, publishers*each)
			var wg sync.WaitGroup
			for p := range publishers {
				wg.Go(func() {
					for i := range each {
						msg := message.NewMessage(fmt.Sprintf("p%d-%d", p, i), nil)
						errs <- pub.Publish(b.topic, msg)
						sent[p] = append(sent[p], msg)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			var rows []struct {
				ID   int64  `db:"id"`
				UUID string `db:"uuid"`
			}
			require.NoError(t, b.db.SelectContext(b.ctx(t), &rows, "SELECT id, uuid FROM "+b.store.Table()))
			require.Len(t, rows, publishers*each)
			idOfRow := map[string]int64{}
			for _, r := range rows {
				idOfRow[r.UUID] = r.ID
			}
			for p, msgs := range sent {
				var prev int64
				for _, m := range msgs {
					id := idOf(t, m)
					require.Equal(t, idOfRow[m.UUID], id, "message %s carries its own record's id", m.UUID)
					require.Greater(t, id, prev, "publisher %d's records are saved in the order it published", p)
					prev = id
				}
			}
		})
	})

	t.Run("UntrackedTopicPassesThrough", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1}, watermill.NopLogger{})
			defer gc.Close()
			sub, err := gc.Subscribe(b.ctx(t), "untracked")
			require.NoError(t, err)
			pub, err := outbox.NewPublisher(b.reg, gc)
			require.NoError(t, err)
			require.NoError(t, pub.Publish("untracked", message.NewMessage("u", []byte("p"))))
			got := <-sub
			got.Ack()
			assert.Empty(t, got.Metadata.Get(outbox.MetadataID))
			assert.Zero(t, b.rowCount(t))
		})
	})

	t.Run("InvalidUTF8MetadataIsRefused", func(t *testing.T) {
		t.Parallel()
		forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
			b := setup(t, backend, sqlstore.Mark)
			raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
			defer raw.Close()
			pub, err := outbox.NewPublisher(b.reg, raw)
			require.NoError(t, err)
			msg := message.NewMessage("u", nil)
			msg.Metadata.Set("bad", "\xff\xfe")
			err = pub.Publish(b.topic, msg)
			require.ErrorIs(t, err, sqlstore.ErrInvalidRecord)
			calls, _ := raw.counts()
			assert.Zero(t, calls)
			assert.Zero(t, b.rowCount(t))
		})
	})
}

// queryCounter counts the statements pgx sends to PostgreSQL.
type queryCounter struct{ n int }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n++
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestPublisherBatchIsOneStatement(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // skip or fail when PostgreSQL is not reachable
	cfg, err := pgx.ParseConfig(testenv.PostgresDSN())
	require.NoError(t, err)
	counter := &queryCounter{}
	cfg.Tracer = counter
	db := sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
	t.Cleanup(func() { _ = db.Close() }) // after the store's cleanup, which drops its tables
	db.SetMaxOpenConns(1)
	backend := testenv.Backends()[0]
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer gc.Close()
	pub, err := outbox.NewPublisher(reg, gc)
	require.NoError(t, err)

	msgs := make([]*message.Message, 100)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
	}
	// The table identity is read once per pool, on first use.
	_, err = store.Identity(context.Background())
	require.NoError(t, err)
	before := counter.n
	require.NoError(t, pub.Publish("orders", msgs...))
	assert.Equal(t, 1, counter.n-before, "100 tracked messages are saved with one statement")
}
