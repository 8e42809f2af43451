package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// binary is outboxctl, built once for the tests, which run it as users do.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxctl")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building outboxctl:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is what a run of outboxctl gave.
type result struct {
	code           int
	stdout, stderr string
}

// outboxctl runs the binary in dir (a fresh temporary directory when ""),
// with OUTBOX_DSN unset unless env sets it.
func outboxctl(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cmd := exec.CommandContext(t.Context(), binary, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_DSN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running outboxctl %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

// fixture is a migrated table with one completed, one abandoned and two
// pending records of "orders", on one backend, and the DSN that reaches it.
type fixture struct {
	dsn   string
	store *sqlstore.Store
	recs  []recordstore.Record
}

func newFixture(t *testing.T, b testenv.Backend) *fixture {
	t.Helper()
	return newFixtureOn(t, b, func(db *sqlx.DB) *sqlstore.Store { return testenv.NewStore(t, b, db, sqlstore.Mark) })
}

// newFixtureOn is newFixture on the marking table that table migrates.
func newFixtureOn(t *testing.T, b testenv.Backend, table func(db *sqlx.DB) *sqlstore.Store) *fixture {
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
	store := table(db)
	ctx := t.Context()
	recs := make([]recordstore.Record, 4)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "orders", UUID: fmt.Sprintf("uuid-%d", i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Metadata: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	require.NoError(t, store.Insert(ctx, recs))
	require.NoError(t, store.Complete(ctx, delivery(recs[0].ID)))
	_, _, err := store.RecordFailure(ctx, delivery(recs[1].ID), "payment service said no", 1, nil)
	require.NoError(t, err)
	return &fixture{dsn: dsn, store: store, recs: recs}
}

// ctl runs outboxctl on the fixture's table, the global flags first.
func (f *fixture) ctl(t *testing.T, args ...string) result {
	t.Helper()
	return outboxctl(t, "", nil, append([]string{"-dsn", f.dsn, "-table", f.store.Table()}, args...)...)
}

// id is the record id of the fixture's ith record, as an argument.
func (f *fixture) id(i int) string { return fmt.Sprint(f.recs[i].ID) }

// delivery is the delivery of record id of "orders" to one handler.
func delivery(id int64) recordstore.Delivery {
	return recordstore.Delivery{ID: id, Topic: "orders", Consumer: "handler"}
}
