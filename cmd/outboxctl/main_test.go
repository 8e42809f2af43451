package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// fixture is a migrated table with one completed, one abandoned and two
// pending records of "orders", on one backend, and the DSN that reaches it.
type fixture struct {
	dsn   string
	store *sqlstore.Store
	recs  []recordstore.Record
}

func newFixture(t *testing.T, b testenv.Backend) *fixture {
	t.Helper()
	var dsn string
	switch b.Name {
	case "Postgres":
		dsn = testenv.PostgresDSN()
	case "MariaDB":
		dsn = testenv.MySQLDSN()
	case "SQLite":
		dsn = testenv.SQLiteDSN(t)
	default:
		t.Fatalf("no DSN for backend %s", b.Name)
	}
	driver := map[string]string{"postgres": "pgx", "mysql": "mysql", "sqlite": "sqlite"}[b.Dialect.Name()]
	db := testenv.Open(t, b.Name, driver, dsn)
	store := testenv.NewStore(t, b, db, sqlstore.Mark)
	ctx := t.Context()
	recs := make([]recordstore.Record, 4)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: fmt.Sprintf("uuid-%d", i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), Metadata: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	require.NoError(t, store.Insert(ctx, recs))
	require.NoError(t, store.Complete(ctx, delivery(recs[0].ID)))
	_, _, err := store.RecordFailure(ctx, delivery(recs[1].ID), "payment service said no", 1, nil)
	require.NoError(t, err)
	return &fixture{dsn: dsn, store: store, recs: recs}
}

// ctl runs outboxctl against the fixture's table and returns its exit code,
// stdout and stderr.
func (f *fixture) ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"-dsn", f.dsn, "-table", f.store.Table()}, args...)
	code := run(context.Background(), full, &out, &errOut, func(string) string { return "" })
	return code, out.String(), errOut.String()
}

func TestOutboxctl(t *testing.T) {
	t.Parallel()
	for _, b := range testenv.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, b)

			code, out, errOut := f.ctl(t, "status")
			require.Zero(t, code, errOut)
			assert.Regexp(t, `NAME\s+PENDING\s+OLDEST PENDING\s+ABANDONED\s+COMPLETED`, out)
			assert.Regexp(t, `orders\s+2\s+\S+\s+1\s+1`, out)

			code, out, errOut = f.ctl(t, "-json", "status")
			require.Zero(t, code, errOut)
			var status struct {
				Completion string `json:"completion"`
				Names      []struct {
					Name      string  `json:"name"`
					Pending   int     `json:"pending"`
					Oldest    float64 `json:"oldest_pending_seconds"`
					Abandoned int     `json:"abandoned"`
					Completed int     `json:"completed"`
				} `json:"names"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &status), out)
			assert.Equal(t, "mark", status.Completion)
			require.Len(t, status.Names, 1)
			assert.Equal(t, 2, status.Names[0].Pending)
			assert.Equal(t, 1, status.Names[0].Abandoned)
			assert.Equal(t, 1, status.Names[0].Completed)

			code, out, errOut = f.ctl(t, "list", "-state", "abandoned")
			require.Zero(t, code, errOut)
			assert.Contains(t, out, "uuid-1")
			assert.Contains(t, out, "payment service said no")
			assert.NotContains(t, out, "uuid-2")

			code, out, errOut = f.ctl(t, "-json", "show", strconv.FormatInt(f.recs[1].ID, 10))
			require.Zero(t, code, errOut)
			var shown recordJSON
			require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
			assert.Equal(t, "abandoned", shown.State)
			assert.Equal(t, `{"n":1}`, shown.Payload)
			assert.Equal(t, f.recs[1].Metadata["traceparent"], shown.Metadata["traceparent"])

			code, out, errOut = f.ctl(t, "replay", "-dry-run")
			require.Zero(t, code, errOut)
			assert.Contains(t, out, "2 pending record(s) would be made due")
			assert.Contains(t, errOut, "2/2", "progress is drawn on stderr")
			claimed, err := f.store.ClaimStale(t.Context(), "orders", time.Hour, 10)
			require.NoError(t, err)
			assert.Empty(t, claimed, "a dry run changes nothing")

			code, out, errOut = f.ctl(t, "replay", "-batch", "1")
			require.Zero(t, code, errOut)
			assert.Contains(t, out, "2 pending record(s) made due")
			claimed, err = f.store.ClaimStale(t.Context(), "orders", time.Hour, 10)
			require.NoError(t, err)
			assert.Len(t, claimed, 2, "the service's resubmitter sends them at its next round")

			code, _, errOut = f.ctl(t, "resubmit", strconv.FormatInt(f.recs[1].ID, 10))
			require.Zero(t, code, errOut)
			require.NoError(t, f.store.CheckPending(t.Context(), delivery(f.recs[1].ID)))
			code, _, errOut = f.ctl(t, "resubmit", strconv.FormatInt(f.recs[1].ID, 10))
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, "not abandoned")

			code, out, errOut = f.ctl(t, "purge", "-older-than", "1h")
			require.Zero(t, code, errOut)
			assert.Contains(t, out, "0 completed record(s) deleted")
			_, err = f.store.DB().ExecContext(t.Context(), "UPDATE "+f.store.Table()+" SET processed_at = '2000-01-01 00:00:00' WHERE processed_at IS NOT NULL")
			require.NoError(t, err)
			code, out, errOut = f.ctl(t, "-json", "purge", "-older-than", "1h")
			require.Zero(t, code, errOut)
			assert.JSONEq(t, `{"deleted": 1}`, out)
		})
	}
}

func TestOutboxctlMistakes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Backends()[0])

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"status"}, &out, &errOut, func(string) string { return "" })
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "no DSN")

	errOut.Reset()
	env := func(k string) string {
		if k == "OUTBOX_DSN" {
			return f.dsn
		}
		return ""
	}
	code = run(context.Background(), []string{"-table", f.store.Table(), "status"}, &out, &errOut, env)
	assert.Zero(t, code, "the DSN comes from OUTBOX_DSN: %s", errOut.String())

	for _, args := range [][]string{{"frobnicate"}, {"show", "abc"}, {"purge"}, {"list", "-state", "stuck"}} {
		code, _, stderr := f.ctl(t, args...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Contains(t, stderr, "outboxctl: ", "%v", args)
	}
	code, _, stderr := f.ctl(t, "-table", "no_such_table", "status")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no_such_table")
}

// delivery is the delivery of record id of "orders" to one handler.
func delivery(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: "handler"}
}
