package scenarios

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Order across services with a database each: service A saves the
// messages of a topic ordered by key in its database and sends them to a
// remote consumer, billing, of service B, which keeps its inbox and its
// effects in a database of its own.

// quickResends is a replay whose stale resubmitter sends a record of a
// topic with remote consumers again once unconfirmed for 300 ms, or for
// twice its wait before that send, up to 2 s, so that the failures B
// reports to A are retried within the scenario's seconds. A shorter cap
// floods the SQL pub/sub on PostgreSQL under the suite's load: its
// subscribers read a batch in one transaction, and no subscriber of the
// database sees a row committed after that transaction began until it
// ends, so confirmations come late, by the batch; every key whose head
// went unconfirmed for the cap is sent again, which makes the next batch
// longer.
var quickResends = outbox.ReplayConfig{Resubmit: outbox.StaleResubmitterConfig{
	OlderThan: 2 * time.Second, ConfirmWithin: 300 * time.Millisecond, Interval: 100 * time.Millisecond}}

var errBillingDown = errors.New("billing is down")

// billingDB is service B's database: its inbox, and the table its handler
// writes each message's effect to, at the next position of the message's
// key, in one transaction with the inbox entry (outbox.InboxTx).
type billingDB struct {
	db      *sqlx.DB
	inbox   *sqlstore.Inbox
	effects string
	// ran holds the UUIDs whose handler ran, on any instance of B.
	ran sync.Map
	// failed counts the runs failed on purpose.
	failed atomic.Int32
}

func (e *env) billingDatabase() *billingDB {
	e.t.Helper()
	db, in := e.databaseOf("billing")
	b := &billingDB{db: db, inbox: in, effects: "effects_" + randomHex(e.t, 5) + "_billing"}
	_, err := db.ExecContext(e.ctx(), "CREATE TABLE "+b.effects+" (k VARCHAR(64) NOT NULL, n INTEGER NOT NULL, pos INTEGER NOT NULL)")
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_, err := db.ExecContext(ctx, "DROP TABLE "+b.effects)
		assert.NoError(e.t, err)
	})
	return b
}

// failsFirstRun tells, from a hash of its UUID, whether the first run of a
// message fails: about three in ten do.
func failsFirstRun(uuid string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uuid))
	return h.Sum32()%10 < 3
}

// handle is B's handler, on every instance: it fails the first run of the
// messages failsFirstRun names, and writes the effect of the others.
func (b *billingDB) handle(msg *message.Message, _ int) error {
	if _, again := b.ran.LoadOrStore(msg.UUID, true); !again && failsFirstRun(msg.UUID) {
		b.failed.Add(1)
		return fmt.Errorf("%w: %s", errBillingDown, msg.UUID)
	}
	return b.apply(msg)
}

// apply writes the effect of msg (its key and number) at the next position
// of its key, with its inbox entry, in one transaction.
func (b *billingDB) apply(msg *message.Message) error {
	ctx := msg.Context()
	tx, err := b.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	switch err := outbox.InboxTx(ctx, tx, msg); {
	case errors.Is(err, outbox.ErrAlreadyHandled):
		return nil // another copy, on another instance, wrote the effect
	case err != nil:
		return err
	}
	k := msg.Metadata.Get("order_key")
	n, err := strconv.Atoi(msg.Metadata.Get("n"))
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, b.db.Rebind("INSERT INTO "+b.effects+" (k, n, pos) SELECT ?, ?, COUNT(*) FROM "+b.effects+" WHERE k = ?"), k, n, k); err != nil {
		return err
	}
	return tx.Commit()
}

// byKey returns each key's numbers in the order of their positions, and
// the positions held by more than one effect.
func (b *billingDB) byKey(t *testing.T) (map[string][]int, []string) {
	t.Helper()
	rows, err := b.db.Query("SELECT k, n, pos FROM " + b.effects + " ORDER BY k, pos, n")
	require.NoError(t, err)
	defer rows.Close()
	got := map[string][]int{}
	var shared []string
	for rows.Next() {
		var k string
		var n, pos int
		require.NoError(t, rows.Scan(&k, &n, &pos))
		if pos != len(got[k]) {
			shared = append(shared, fmt.Sprintf("%s at %d (n=%d)", k, pos, n))
		}
		got[k] = append(got[k], n)
	}
	require.NoError(t, rows.Err())
	return got, shared
}

// waitCompleted polls A's table until it holds n records, each completed;
// their UUIDs are "key-number".
func (e *env) waitCompleted(n int) {
	e.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		rows, err := e.readRows()
		done := 0
		for _, r := range rows {
			if r.Completed {
				done++
			}
		}
		if err == nil && len(rows) == n && done == n {
			return
		}
		if time.Now().After(deadline) {
			var heads []string
			keys := map[string]bool{}
			for _, r := range rows {
				if k, _, _ := strings.Cut(r.UUID, "-"); !r.Completed && !keys[k] {
					keys[k] = true
					heads = append(heads, r.UUID)
				}
			}
			e.t.Fatalf("within %v, %d of %d records completed (%d saved, read error %v); the first pending of each key: %v", waitTimeout, done, n, len(rows), err, heads)
		}
		time.Sleep(20 * time.Millisecond) // polling the table, not waiting for an event
	}
}

// keysInOrderAtARemoteConsumer, between services with a database each:
// service A publishes 10 keys × 10 messages to a topic ordered by key
// whose remote consumer is billing, in batches that each hold the n-th
// message of every key. Billing runs in service B, whose database keeps
// its inbox and the effects, written with the inbox entry in one
// transaction; where the broker shares a queue or group between
// subscribers, B runs two instances on it over the one database. The
// first run of about three messages in ten fails, so that B holds the
// messages that come after them. Once A's records are all complete, each
// key's effects in B's database are its messages, each once, in the order
// A saved them.
func keysInOrderAtARemoteConsumer(t *testing.T, e *env) {
	// Ten keys keep the exchange within seconds on the SQL pub/sub, whose
	// every round trip waits for the batches of both services.
	const keys, perKey = 10, 10
	confirmTopic := "confirm_" + e.topic
	if e.backend.Remove != nil {
		t.Cleanup(func() { e.backend.Remove(t, confirmTopic, e.group+"_confirm") })
	}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: e.store, OrderKey: "order_key",
		RemoteConsumers: []string{"billing"}, ConfirmTopic: confirmTopic})
	require.NoError(t, err)
	e.reg = reg
	obs := newCounts()
	reg.SetObserver(obs)
	pub, _ := e.connect()
	_, confirmations := e.connectAs("confirm")
	a := e.startServiceWith(serviceConfig{reg: reg, pub: pub, decide: succeed, confirmations: confirmations, replay: quickResends})

	billing := e.billingDatabase()
	logger := &testenv.CaptureLogger{}
	instances := 2
	if e.backend.FanOut {
		// Each subscriber would get every message: one instance.
		instances = 1
	}
	var bs []*service
	for range instances {
		bReg, err := outbox.NewRegistry() // B tracks nothing of its own
		require.NoError(t, err)
		bPub, bSub := e.connectAs("billing")
		b := e.startServiceWith(serviceConfig{reg: bReg, pub: bPub, decide: billing.handle, logger: logger,
			mw:        outbox.MiddlewareConfig{Inbox: billing.inbox, Confirmations: bPub},
			receivers: []receiver{{name: "billing", topic: e.topic, sub: bSub}}})
		go b.drain()
		bs = append(bs, b)
	}

	publisher := e.tracked(pub)
	start := time.Now()
	var uuids []string
	wantFailed := 0
	for n := range perKey {
		msgs := make([]*message.Message, keys)
		for k := range keys {
			u := fmt.Sprintf("k%02d-%02d", k, n)
			msgs[k] = message.NewMessage(u, []byte(fmt.Sprintf(`{"order":%q}`, u)))
			msgs[k].Metadata.Set("order_key", fmt.Sprintf("k%02d", k))
			msgs[k].Metadata.Set("n", strconv.Itoa(n))
			uuids = append(uuids, u)
			if failsFirstRun(u) {
				wantFailed++
			}
		}
		publishSaved(t, publisher, e.topic, msgs)
	}

	e.waitCompleted(keys * perKey)
	took := time.Since(start)
	a.stop()
	for _, b := range bs {
		b.stop()
	}

	got, shared := billing.byKey(t)
	assert.Empty(t, shared, "two effects of a key at one position: their handlings overlapped")
	var bad []string
	for k := range keys {
		key := fmt.Sprintf("k%02d", k)
		ns := got[key]
		ok := len(ns) == perKey
		for i := 0; ok && i < perKey; i++ {
			ok = ns[i] == i
		}
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: %v", key, ns))
		}
	}
	assert.Empty(t, bad, "each key's effects in B's database, by position, are its messages once each in the order A saved them")
	assert.Len(t, got, keys, "no effect of a key that was not published")
	assert.Equal(t, int32(wantFailed), billing.failed.Load(), "the first run of each message named to fail failed")
	assert.Positive(t, obs.get("failed", "billing"), "B's failures reached A")
	held := 0
	for _, entry := range logger.Entries("debug") {
		if strings.Contains(entry.Msg, "holding the message") {
			held++
		}
	}
	assert.Positive(t, held, "B held the messages whose earlier message it had not handled")
	e.requireTable(completedAll(uuids...))

	runs := make([]int, len(bs))
	for i, b := range bs {
		runs[i] = b.totalRuns()
	}
	t.Logf("%s: A's records complete %v after the first publish; %d failed first runs, %d held copies; handler runs by instance of B %v",
		e.backend.Name, took.Round(time.Millisecond), billing.failed.Load(), held, runs)
}
