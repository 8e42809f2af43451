package scenarios

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Two services that track the same topic, each in a table of its own: each
// handles the other's messages untracked and touches only its own records.

// sharingService is one of two services that track the same topic, each in
// a table of its own database.
type sharingService struct {
	name    string // its handler, and consumer group
	db      *sqlx.DB
	store   *sqlstore.Store
	reg     *outbox.Registry
	obs     *counts
	logger  *testenv.CaptureLogger
	svc     *service
	tracked message.Publisher
	own     []string // UUIDs it published
	// seen is the first successful delivery of each message to its handler.
	seen map[runKey]delivery
}

func (e *env) startSharingService(name string, db *sqlx.DB, store *sqlstore.Store) *sharingService {
	e.t.Helper()
	s := &sharingService{name: name, db: db, store: store, obs: newCounts(), logger: &testenv.CaptureLogger{}, seen: map[runKey]delivery{}}
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: e.topic, Store: store})
	require.NoError(e.t, err)
	reg.SetObserver(s.obs)
	s.reg = reg
	pub, sub := e.connectAs(name)
	s.tracked, err = outbox.NewPublisher(reg, pub)
	require.NoError(e.t, err)
	s.svc = e.startServiceWith(serviceConfig{reg: reg, pub: pub, decide: succeed, logger: s.logger,
		receivers: []receiver{{name: name, topic: e.topic, sub: sub}}})
	return s
}

// otherDatabase opens a second service's record store: a database engine
// other than the backend's record database, with a table of the same name,
// so that only the table identity tells the two tables apart.
func (e *env) otherDatabase() (*sqlx.DB, *sqlstore.Store) {
	e.t.Helper()
	engine := "SQLite"
	if e.backend.Records.Name == "SQLite" {
		engine = "Postgres"
	}
	var b testenv.Backend
	for _, c := range testenv.Backends() {
		if c.Name == engine {
			b = c
		}
	}
	db := b.Open(e.t)
	table := e.store.Table()
	store, err := sqlstore.New(sqlstore.Config{Dialect: b.Dialect, Table: table, Completion: sqlstore.Mark, DB: db})
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(e.t, store.Migrate(ctx))
	e.t.Cleanup(func() { testenv.DropTable(e.t, db, b.Dialect, table) })
	return db, store
}

func twoServicesShareATopic(t *testing.T, e *env) {
	const m = 20
	otherDB, otherStore := e.otherDatabase()
	billing := e.startSharingService("billing", e.db, e.store)
	shipping := e.startSharingService("shipping", otherDB, otherStore)
	services := []*sharingService{billing, shipping}

	ctx := e.ctx()
	billingID, err := billing.store.Identity(ctx)
	require.NoError(t, err)
	shippingID, err := shipping.store.Identity(ctx)
	require.NoError(t, err)
	require.NotEqual(t, billingID, shippingID, "two tables of the same name in two databases have two identities")

	waitAll := func(uuids []string) {
		for _, s := range services {
			for k, d := range s.svc.handledByEach([]string{s.name}, uuids) {
				s.seen[k] = d
			}
		}
	}
	// One service publishes, then the other: record ids of both tables
	// start at 1, so the second service's ids are the first one's, which
	// the first one has completed already. Only the table identity keeps a
	// service from skipping the other's messages as its own duplicates.
	msgs, first := newMessages("billing-first", m)
	billing.own = append(billing.own, first...)
	publish(t, billing.tracked, e.topic, msgs)
	waitAll(first)
	requireRecords(t, recordsIn(t, shipping.db, shipping.store.Table()), map[string]bool{})

	msgs, second := newMessages("shipping-second", m)
	shipping.own = append(shipping.own, second...)
	publish(t, shipping.tracked, e.topic, msgs)
	waitAll(second)

	// Then both at once.
	both, errs := []string{}, make(chan error, len(services))
	for _, s := range services {
		msgs, uuids := newMessages(s.name+"-both", m)
		s.own = append(s.own, uuids...)
		both = append(both, uuids...)
		go func() { errs <- s.tracked.Publish(e.topic, msgs...) }()
	}
	for range services {
		require.NoError(t, <-errs)
	}
	waitAll(both)
	for _, s := range services {
		s.svc.stop()
	}

	all := append(append(append([]string{}, first...), second...), both...)
	for i, s := range services {
		other := services[1-i]
		for _, u := range all {
			assert.Equal(t, 1, s.svc.runsOf(s.name, u), "%s ran for %s", s.name, u)
		}
		assert.Equal(t, len(all), s.svc.totalRuns(), "%s ran for no message twice", s.name)
		assert.Equal(t, len(s.own), s.obs.get("handled", s.name), "%s completed each of its own records", s.name)
		assert.Equal(t, len(other.own), s.obs.get("not-owned", s.name), "%s ran each of the other's messages untracked", s.name)
		for _, what := range []string{"duplicate", "unknown", "mismatched", "failed"} {
			assert.Zero(t, s.obs.get(what, s.name), "%s: %s", s.name, what)
		}
		assert.Empty(t, s.logger.Entries("error"), "%s logged errors", s.name)
		t.Logf("%s: service %s handled %d messages (%d own, tracked; %d of the other's, untracked), %d copies skipped",
			e.backend.Name, s.name, countRuns(s.svc, s.name, all), len(s.own), len(other.own), s.obs.get("duplicate", s.name))

		// Its table holds its own records only, each completed by its own
		// handler: the other service's handler is not the one that
		// completed any of them.
		rows := recordsIn(t, s.db, s.store.Table())
		requireRecords(t, rows, completedAll(s.own...))
		pending, err := s.store.PendingAfter(ctx, e.topic, 0, len(all)+1)
		require.NoError(t, err)
		assert.Empty(t, pending, "%s: pending records", s.name)
		requireCompletedBy(t, s.store, e.topic, rows, s.name, other.name)
	}
	assertTrackedOnlyOwn(t, e.topic, services, all)
	assertIDsCollide(t, billing, shipping)
}

// assertTrackedOnlyOwn checks what each handler was given: its own
// messages tracked, with their record, and the other's untracked, carrying
// the other table's identity.
func assertTrackedOnlyOwn(t *testing.T, topic string, services []*sharingService, all []string) {
	t.Helper()
	for _, s := range services {
		own := map[string]bool{}
		for _, u := range s.own {
			own[u] = true
		}
		ownID, err := s.store.Identity(context.Background())
		require.NoError(t, err)
		for _, u := range all {
			d := s.seen[runKey{s.name, u}]
			if own[u] {
				assert.True(t, d.Tracked, "%s handles its own %s tracked", s.name, u)
				assert.Equal(t, outbox.RecordRef{Topic: topic, ID: d.Record.ID, Consumer: s.name}, d.Record)
				assert.Equal(t, ownID, d.Received.Get(outbox.MetadataTable))
			} else {
				assert.False(t, d.Tracked, "%s handles the other's %s untracked", s.name, u)
				assert.NotEqual(t, ownID, d.Received.Get(outbox.MetadataTable))
				assert.NotEmpty(t, d.Received.Get(outbox.MetadataID), "the other's message carries its record id")
			}
		}
	}
}

// assertIDsCollide makes sure the scenario proved something: the two
// tables hold records with the same ids.
func assertIDsCollide(t *testing.T, a, b *sharingService) {
	t.Helper()
	ids := map[int64]bool{}
	for _, r := range recordsIn(t, a.db, a.store.Table()) {
		ids[r.ID] = true
	}
	var shared []string
	for _, r := range recordsIn(t, b.db, b.store.Table()) {
		if ids[r.ID] {
			shared = append(shared, fmt.Sprint(r.ID))
		}
	}
	assert.NotEmpty(t, shared, "the two tables share no record id")
	t.Logf("record ids in both tables: %s", strings.Join(shared, ","))
}
