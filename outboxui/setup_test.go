package outboxui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// seeded is a store with records in every state, and the dashboard of it
// served under /outbox/ as a service mounts it.
type seeded struct {
	store  *sqlstore.Store
	server *httptest.Server
	logger *testenv.CaptureLogger
	// The records of topic "orders" (no consumers): one pending, one
	// abandoned, one completed; of topic "payments", declared consumers
	// "ship" and "stats": one pending for both, one abandoned by "ship".
	pending, abandoned, completed, shared, sharedAbandoned int64
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// seed fills a fresh table of the backend and serves its dashboard.
func seed(t *testing.T, b testenv.Backend, cfg outboxui.Config) *seeded {
	t.Helper()
	ctx := testCtx(t)
	s := testenv.NewStore(t, b, b.Open(t), sqlstore.Mark)
	recs := []recordstore.Record{
		{Topic: "orders", UUID: "u-pending", Payload: []byte(`{"order":"o-1"}`), Metadata: map[string]string{"tenant": "acme"}},
		{Topic: "orders", UUID: "u-abandoned", Payload: []byte{0x00, 0x01, 0xfe, 0xff}},
		{Topic: "orders", UUID: "u-completed", Payload: []byte(`{"order":"o-3"}`)},
		{Topic: "payments", UUID: "u-shared", Payload: []byte(`{"pay":1}`), Consumers: []string{"ship", "stats"}},
		{Topic: "payments", UUID: "u-shared-abandoned", Payload: []byte(`{"pay":2}`), Consumers: []string{"ship", "stats"}},
	}
	require.NoError(t, s.Insert(ctx, recs))
	d := &seeded{store: s, pending: recs[0].ID, abandoned: recs[1].ID, completed: recs[2].ID, shared: recs[3].ID, sharedAbandoned: recs[4].ID}
	_, gaveUp, err := s.RecordFailure(ctx, recordstore.Delivery{ID: d.abandoned, Topic: "orders"}, "broker said no", 1, nil)
	require.NoError(t, err)
	require.True(t, gaveUp)
	require.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: d.completed, Topic: "orders"}))
	require.NoError(t, s.Complete(ctx, recordstore.Delivery{ID: d.sharedAbandoned, Topic: "payments", Consumer: "stats"}))
	_, gaveUp, err = s.RecordFailure(ctx, recordstore.Delivery{ID: d.sharedAbandoned, Topic: "payments", Consumer: "ship"}, "label printer on fire", 1, nil)
	require.NoError(t, err)
	require.True(t, gaveUp)

	d.logger = &testenv.CaptureLogger{}
	ui, err := outboxui.New(s, cfg, d.logger)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
	d.server = httptest.NewServer(mux)
	t.Cleanup(d.server.Close)
	return d
}

// backend returns the named backend of testenv.
func backend(t *testing.T, name string) testenv.Backend {
	for _, b := range testenv.Backends() {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no backend %s", name)
	return testenv.Backend{}
}

// httptestServer serves h at the root and returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
