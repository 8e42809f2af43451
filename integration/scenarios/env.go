package scenarios

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// waitTimeout bounds every wait for a delivery; brokers answer in
// milliseconds, so reaching it means something is lost.
const waitTimeout = 60 * time.Second

// env is what one scenario needs: a tracked topic of its own on the broker,
// its consumer group, and the record table it saves into.
type env struct {
	t       *testing.T
	backend Backend
	db      *sqlx.DB
	store   *sqlstore.Store
	reg     *outbox.Registry
	topic   string // tracked
	plain   string // untracked
	group   string
	// groups are the further groups that connectAs opened.
	groups map[string]bool
}

func newEnv(t *testing.T, b Backend) *env {
	t.Helper()
	db := b.Records.Open(t)
	store := testenv.NewStore(t, b.Records, db, sqlstore.Mark)
	suffix := randomHex(t, 5)
	e := &env{
		t: t, backend: b, db: db, store: store,
		topic:  "orders_" + suffix,
		plain:  "plain_" + suffix,
		group:  "svc_" + suffix,
		groups: map[string]bool{},
	}
	if b.Remove != nil {
		// Registered before any Connect, so it runs after their closes.
		t.Cleanup(func() {
			b.Remove(t, e.topic, e.group)
			b.Remove(t, e.plain, e.group)
		})
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: store})
	require.NoError(t, err)
	require.True(t, reg.Enabled(), "set %s=on in the test binary (TestMain) to run the scenarios", outbox.EnvToggle)
	e.reg = reg
	return e
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// ctx is bounded by the test's own lifetime.
func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	e.t.Cleanup(cancel)
	return ctx
}

// connect opens a publisher and subscriber of the service's group.
func (e *env) connect() (message.Publisher, message.Subscriber) {
	return e.backend.Connect(e.t, e.group)
}

// tracked returns a publisher that saves a record for every tracked message.
func (e *env) tracked(pub message.Publisher) message.Publisher {
	p, err := outbox.NewPublisher(e.reg, pub)
	require.NoError(e.t, err)
	return p
}

// row is one record as the table holds it.
type row struct {
	ID        int64  `db:"id"`
	UUID      string `db:"uuid"`
	Completed bool   `db:"completed"`
}

// rows returns the table's records by id.
func (e *env) rows() []row {
	e.t.Helper()
	out, err := e.readRows()
	require.NoError(e.t, err)
	return out
}

// readRows is rows for a goroutine other than the test's.
func (e *env) readRows() ([]row, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []row
	return out, e.db.SelectContext(ctx, &out, selectRows+e.store.Table()+" ORDER BY id")
}

const selectRows = "SELECT id, uuid, processed_at IS NOT NULL AS completed FROM "

// requireTable asserts the table holds exactly these message UUIDs, and
// whether each one's record is completed.
func (e *env) requireTable(want map[string]bool) {
	e.t.Helper()
	e.waitCompletions()
	requireRecords(e.t, e.rows(), want)
}

// waitCompletions waits for the completions that follow the
// acknowledgements of the messages handled so far.
func (e *env) waitCompletions() {
	e.t.Helper()
	if e.reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(e.t, e.reg.WaitCompletions(ctx))
}

// requireRecords asserts the records are exactly these message UUIDs, and
// whether each one's record is completed.
func requireRecords(t *testing.T, rows []row, want map[string]bool) {
	t.Helper()
	got := map[string]bool{}
	for _, r := range rows {
		_, dup := got[r.UUID]
		require.False(t, dup, "message %s saved twice", r.UUID)
		got[r.UUID] = r.Completed
	}
	require.Equal(t, want, got, "records by message UUID: completed?")
}

// recordID returns the id of the record of a message.
func (e *env) recordID(uuid string) int64 {
	e.t.Helper()
	for _, r := range e.rows() {
		if r.UUID == uuid {
			return r.ID
		}
	}
	e.t.Fatalf("no record for message %s", uuid)
	return 0
}

// connectAs opens a publisher and subscriber of a group of its own, named
// after the consumer: a second consumer group, durable, queue or (on
// GoChannel) subscriber of the same topic, which receives every message as
// the service's own group does.
func (e *env) connectAs(consumer string) (message.Publisher, message.Subscriber) {
	group := e.group + "_" + consumer
	if e.backend.Remove != nil && !e.groups[group] {
		e.groups[group] = true
		// Registered before the Connect, so it runs after its closes.
		e.t.Cleanup(func() { e.backend.Remove(e.t, e.topic, group) })
	}
	return e.backend.Connect(e.t, group)
}

// declare replaces the registry with one whose tracked topic declares these
// consumers.
func (e *env) declare(consumers ...string) {
	e.t.Helper()
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: e.store, Consumers: consumers})
	require.NoError(e.t, err)
	e.reg = reg
}

// recordsIn returns the records of a table by id.
func recordsIn(t *testing.T, db *sqlx.DB, table string) []row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []row
	require.NoError(t, db.SelectContext(ctx, &out, selectRows+table+" ORDER BY id"))
	return out
}
