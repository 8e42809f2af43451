package outbox_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Environment of the child process of TestTxPublishCrashAfterCommit.
const (
	envTxChild   = "OUTBOX_TX_CRASH_CHILD" // the backend name
	envTxDSN     = "OUTBOX_TX_CRASH_DSN"
	envTxTable   = "OUTBOX_TX_CRASH_TABLE"
	envTxEffects = "OUTBOX_TX_CRASH_EFFECTS"
	txSending    = "SENDING"
)

// driverDSN is the driver and DSN of a backend, with a fresh SQLite file.
func driverDSN(t *testing.T, backend string) (string, string) {
	switch backend {
	case "Postgres":
		return "pgx", testenv.PostgresDSN()
	case "MariaDB":
		return "mysql", testenv.MySQLDSN()
	default:
		return "sqlite", testenv.SQLiteDSN(t)
	}
}

// TestTxPublishCrashAfterCommit kills a real process (SIGKILL) after its
// transaction committed the business row and the record, while it sends
// the message; the next start's replay delivers it and the receiver
// completes it.
func TestTxPublishCrashAfterCommit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		driver, dsn := driverDSN(t, backend.Name)
		db := testenv.Open(t, backend.Name, driver, dsn)
		store := testenv.NewStore(t, backend, db, sqlstore.Mark)
		reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders_" + store.Table(), Store: store})
		require.NoError(t, err)
		b := &bundle{backend: backend, db: db, store: store, reg: reg, topic: "orders_" + store.Table(), logger: &testenv.CaptureLogger{}}
		fx := effectsTable(t, b)

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTxPublishCrashChild$", "-test.count=1")
		child.Env = append(os.Environ(), envTxChild+"="+backend.Name, envTxDSN+"="+dsn, envTxTable+"="+store.Table(), envTxEffects+"="+fx)
		child.Stderr = os.Stderr
		out, err := child.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, child.Start())
		lines := bufio.NewScanner(out)
		reached := false
		for !reached && lines.Scan() {
			reached = strings.TrimSpace(lines.Text()) == txSending
		}
		require.True(t, reached, "the child stopped before it committed and started sending")
		require.NoError(t, child.Process.Signal(syscall.SIGKILL))
		err = child.Wait()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "killed")

		assert.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM "+fx), "the business row committed")
		require.Equal(t, 1, b.pendingCount(t), "the record committed with it and was never sent")

		handled := newHandledSet(1)
		router, _ := restartedService(t, b, handled, nil, outbox.ReplayConfig{})
		runUntilHandled(t, b, router, handled)
		assert.Equal(t, map[string]int{"crash-tx-1": 1}, handled.snapshot(), "the replay delivered the message")
		assert.Zero(t, b.pendingCount(t), "and the receiver completed it")
	})
}

// TestTxPublishCrashChild is the process TestTxPublishCrashAfterCommit
// kills; it does nothing on its own.
func TestTxPublishCrashChild(t *testing.T) {
	name := os.Getenv(envTxChild)
	if name == "" {
		t.Skip("runs only as the child of TestTxPublishCrashAfterCommit")
	}
	var backend testenv.Backend
	for _, b := range testenv.Backends() {
		if b.Name == name {
			backend = b
		}
	}
	driver, _ := driverDSN(t, name)
	db := testenv.Open(t, name, driver, os.Getenv(envTxDSN))
	table := os.Getenv(envTxTable)
	store, err := sqlstore.New(sqlstore.Config{Dialect: backend.Dialect, Table: table, DB: db})
	require.NoError(t, err)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders_" + table, Store: store})
	require.NoError(t, err)
	p, err := outbox.NewTxPublisher(reg, haltingPublisher{})
	require.NoError(t, err)

	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	ptx := p.Wrap(tx)
	_, err = ptx.ExecContext(ctx, "INSERT INTO "+os.Getenv(envTxEffects)+" (record_id) VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, ptx.Publish(ctx, "orders_"+table, message.NewMessage("crash-tx-1", []byte("order"))))
	_ = ptx.Commit() // halts in the send, where the parent kills the process
	t.Fatal("the send returned")
}

// haltingPublisher tells the parent that the send started and then never
// returns.
type haltingPublisher struct{}

func (haltingPublisher) Publish(string, ...*message.Message) error {
	fmt.Println(txSending)
	time.Sleep(time.Hour) // a timer, unlike select{}, is never taken for a deadlock
	return fmt.Errorf("not killed")
}

func (haltingPublisher) Close() error { return nil }
