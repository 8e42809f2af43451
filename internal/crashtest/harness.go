// Package crashtest runs a service that publishes and handles tracked
// messages as a real child process, kills it with SIGKILL at chosen or random
// moments, restarts it, and checks at the end that no committed record was
// lost. The service has one handler of the tracked topic, or several
// declared consumers, each of which must handle every record.
//
// A test binary calls [Run] in the parent test and [Child] from a test that
// only does something when the [EnvChild] variable is set, so that the test
// binary re-executed is the service.
//
// [RunServices] does the same to two services at once, each a process with
// a database of its own, that meet only on the broker: [ServiceA] publishes
// a tracked topic whose remote consumer is [ServiceB]'s handler, which
// keeps an inbox and confirms over the broker. It checks that every record
// of A has exactly one effect in B's database and that A's table drains.
// Its ordered variant ([ServicesConfig.Keys]) orders A's topic by key, runs
// B as several processes on one queue and one database, and checks that
// each key's effects in B's database follow the order of A's records.
package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// Environment variables that configure a child.
const (
	EnvChild = "OUTBOX_CRASH_CHILD" // the test name to run as a child
	envMode  = "OUTBOX_CRASH_MODE"
	envAt    = "OUTBOX_CRASH_AT"
	envCycle = "OUTBOX_CRASH_CYCLE"
	envBatch = "OUTBOX_CRASH_BATCH"
	envTable = "OUTBOX_CRASH_TABLE"
	// envConsumers lists the declared consumers, comma-separated; empty
	// for one undeclared handler.
	envConsumers = "OUTBOX_CRASH_CONSUMERS"
	// envOrdered, "1", orders the tracked topic by key ([Config.Ordered]).
	envOrdered = "OUTBOX_CRASH_ORDERED"
	// envChecked, "1", checks every copy and completes before the
	// acknowledgement ([Config.Checked]).
	envChecked = "OUTBOX_CRASH_CHECKED"
	// envKeys is the number of order keys of an ordered two-service run
	// ([ServicesConfig.Keys]).
	envKeys = "OUTBOX_CRASH_KEYS"
	// envHaltAfter, in milliseconds from the child's start, arms its kill
	// point from then on instead of at its envAt-th pass.
	envHaltAfter = "OUTBOX_CRASH_HALT_AFTER"
)

// OrderKeys is how many order keys the messages of an ordered run
// ([Config.Ordered]) cycle through, across the children, so that each key
// has records of many starts.
const OrderKeys = 3

// SingleHandler is the name of the service's handler when it declares no
// consumers.
const SingleHandler = "crash"

// Mode says where a child halts so the parent can kill it there.
type Mode string

// The kill points.
const (
	// AfterInsert halts after the record was committed, before the send.
	AfterInsert Mode = "after-insert"
	// MidHandler halts inside the handler, after it recorded its handling.
	MidHandler Mode = "mid-handler"
	// BeforeMark halts after the handler succeeded, before the completion.
	BeforeMark Mode = "before-mark"
	// AfterCommit halts a handler in another service after its
	// transaction committed, before the confirmation ([RunServices]).
	AfterCommit Mode = "after-commit"
	// Random is killed after a random delay, wherever it is.
	Random Mode = "random"
	// Drain replays, handles everything pending and exits cleanly.
	Drain Mode = "drain"
)

var killModes = []Mode{AfterInsert, MidHandler, BeforeMark, Random}

// Config configures [Run].
type Config struct {
	// ChildTest is the name of the test function that calls [Child].
	ChildTest string
	// Kills is the number of kill cycles.
	Kills int
	// Batch is the number of messages each child publishes.
	Batch int
	// Seed seeds the choice of kill points; print it to replay a failure.
	Seed uint64
	// DB is the database the child uses, for the final checks.
	DB *sqlx.DB
	// Table is the record table; its handled table is Table+"_handled".
	Table string
	// Consumers are the declared consumers of the tracked topic: the child
	// runs one handler of each, and each must handle every record. Empty
	// for one handler ([SingleHandler]) and no declaration.
	Consumers []string
	// Env is added to every child's environment (DSNs, broker names).
	Env []string
	// Ordered gives the tracked topic an order key (outbox.Tracked.OrderKey)
	// and the messages [OrderKeys] keys in turn; the summary then counts,
	// per consumer, the handlings of a key that came before a handling of
	// an earlier record of that key ([ConsumerSummary.OutOfOrder]).
	Ordered bool
	// Checked makes the child's middleware check every copy and complete
	// each delivery before its acknowledgement (outbox.MiddlewareConfig's
	// Check.FirstCopies and Complete.BeforeAck), instead of the defaults,
	// under which a kill between a handler's return and its completion's
	// commit must cost a resend, never a record.
	Checked bool
}

// Summary is what a run found.
type Summary struct {
	Kills     map[Mode]int
	Records   int // committed records
	Pending   int // records still pending after the final drain
	Consumers []ConsumerSummary
}

// ConsumerSummary is what one consumer (handler) did over a run.
type ConsumerSummary struct {
	Consumer   string
	Handled    int // distinct records handled
	Handlings  int // handler runs recorded
	Duplicates int // Handlings - Handled
	Lost       int // committed records this consumer never handled
	// OutOfOrder counts, in an ordered run, the handlings of a record
	// that followed a handling of a later record of its key.
	OutOfOrder int
}

// String is the summary line a test logs.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kills=%d %v records=%d pending=%d", total(s.Kills), s.Kills, s.Records, s.Pending)
	for _, c := range s.Consumers {
		fmt.Fprintf(&b, "; %s", c)
	}
	return b.String()
}

// String is the consumer's part of a summary line.
func (c ConsumerSummary) String() string {
	return fmt.Sprintf("%s: handled=%d handlings=%d duplicates=%d lost=%d out_of_order=%d", c.Consumer, c.Handled, c.Handlings, c.Duplicates, c.Lost, c.OutOfOrder)
}

// total adds up kill counts.
func total[K comparable](kills map[K]int) int {
	n := 0
	for _, k := range kills {
		n += k
	}
	return n
}

// Run kills and restarts children cfg.Kills times, then drains once and
// counts. The caller asserts on the summary.
func Run(t *testing.T, cfg Config) Summary {
	t.Helper()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	sum := Summary{Kills: map[Mode]int{}}
	for cycle := 0; cycle < cfg.Kills; cycle++ {
		mode := killModes[rng.IntN(len(killModes))]
		// A message is sent once and handled once per consumer.
		points := cfg.Batch
		if mode == MidHandler || mode == BeforeMark {
			points *= len(handlers(cfg.Consumers))
		}
		at := rng.IntN(points)
		delay := time.Duration(rng.IntN(150)) * time.Millisecond
		if err := killCycle(t, cfg, cycle, mode, at, delay); err != nil {
			t.Fatalf("cycle %d (%s at %d, seed %d): %v", cycle, mode, at, cfg.Seed, err)
		}
		sum.Kills[mode]++
	}
	if err := drain(t, cfg, cfg.Kills); err != nil {
		t.Fatalf("final drain (seed %d): %v", cfg.Seed, err)
	}
	count(t, cfg, &sum)
	return sum
}

func childCmd(cfg Config, cycle int, mode Mode, at int) *exec.Cmd {
	env := append(append([]string(nil), cfg.Env...),
		envMode+"="+string(mode),
		fmt.Sprintf("%s=%d", envAt, at),
		fmt.Sprintf("%s=%d", envCycle, cycle),
		fmt.Sprintf("%s=%d", envBatch, cfg.Batch),
		envTable+"="+cfg.Table,
		envConsumers+"="+strings.Join(cfg.Consumers, ","),
	)
	if cfg.Ordered {
		env = append(env, envOrdered+"=1")
	}
	if cfg.Checked {
		env = append(env, envChecked+"=1")
	}
	return command(cfg.ChildTest, env...)
}

// killCycle starts a child and kills it with SIGKILL at its halt line, at its
// idle line, or after delay in Random mode.
func killCycle(t *testing.T, cfg Config, cycle int, mode Mode, at int, delay time.Duration) error {
	p, err := startProc(childCmd(cfg, cycle, mode, at))
	if err != nil {
		return err
	}
	var timer <-chan time.Time
	if mode == Random {
		timer = time.After(delay)
	}
	deadline := time.After(60 * time.Second)
	reason := ""
wait:
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				return p.exited()
			}
			if strings.HasPrefix(line, "HALT") || line == "IDLE" {
				reason = line
				break wait
			}
		case <-timer:
			reason = "timer"
			break wait
		case <-deadline:
			return fmt.Errorf("child neither halted nor idled within 60s: %s", p.killedStderr())
		}
	}
	if err := p.kill(); err != nil { // SIGKILL
		return fmt.Errorf("kill (%s): %w", reason, err)
	}
	return nil
}

func drain(t *testing.T, cfg Config, cycle int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	template := childCmd(cfg, cycle, Drain, 0)
	cmd := exec.CommandContext(ctx, template.Path, template.Args[1:]...)
	cmd.Env = template.Env
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("drain child failed: %v\n%s", err, tail(string(b)))
	}
	if !strings.Contains(string(b), "DRAINED") {
		return fmt.Errorf("drain child did not report DRAINED:\n%s", tail(string(b)))
	}
	return nil
}

func count(t *testing.T, cfg Config, sum *Summary) {
	t.Helper()
	handled := cfg.Table + "_handled"
	q := func(query string) int {
		var n int
		if err := cfg.DB.Get(&n, query); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	sum.Records = q("SELECT COUNT(*) FROM " + cfg.Table)
	sum.Pending = q("SELECT COUNT(*) FROM " + cfg.Table + " WHERE processed_at IS NULL")
	for _, c := range handlers(cfg.Consumers) {
		// Consumer names are the test's own constants.
		of := " WHERE consumer = '" + c + "'"
		cs := ConsumerSummary{Consumer: c}
		cs.Handlings = q("SELECT COUNT(*) FROM " + handled + of)
		cs.Handled = q("SELECT COUNT(DISTINCT uuid) FROM " + handled + of)
		cs.Lost = q("SELECT COUNT(*) FROM " + cfg.Table + " r WHERE NOT EXISTS (SELECT 1 FROM " + handled + " h WHERE h.uuid = r.uuid AND h.consumer = '" + c + "')")
		cs.Duplicates = cs.Handlings - cs.Handled
		if cfg.Ordered {
			cs.OutOfOrder = outOfOrder(t, cfg, c)
		}
		sum.Consumers = append(sum.Consumers, cs)
	}
	if n := q("SELECT COUNT(*) FROM " + handled); n != sumHandlings(sum.Consumers) {
		t.Fatalf("%d handlings recorded, %d of them by the service's handlers", n, sumHandlings(sum.Consumers))
	}
}

// outOfOrder counts the handlings of consumer, in the order they were
// recorded, whose record's id is below that of an earlier handling of its
// key: a record handled after a later one of its key. Every recorded
// handling counts, a killed one too: no later record of a key may run
// before an earlier one completed, so even an interrupted handling of the
// earlier record precedes it.
func outOfOrder(t *testing.T, cfg Config, consumer string) int {
	t.Helper()
	var rows []struct {
		Key string `db:"order_key"`
		ID  int64  `db:"record_id"`
	}
	// Consumer names are the test's own constants.
	if err := cfg.DB.Select(&rows, "SELECT order_key, record_id FROM "+cfg.Table+"_handled WHERE consumer = '"+consumer+"' ORDER BY n"); err != nil {
		t.Fatal(err)
	}
	last, n := map[string]int64{}, 0
	for _, r := range rows {
		if r.ID < last[r.Key] {
			n++
			continue
		}
		last[r.Key] = r.ID
	}
	return n
}

// handlers returns the handler names of a service that declares these
// consumers.
func handlers(consumers []string) []string {
	if len(consumers) == 0 {
		return []string{SingleHandler}
	}
	return consumers
}

func sumHandlings(cs []ConsumerSummary) int {
	n := 0
	for _, c := range cs {
		n += c.Handlings
	}
	return n
}

// Check fails the test unless every committed record was handled by every
// consumer and none is pending.
func Check(t *testing.T, s Summary) {
	t.Helper()
	checkDrained(t, s.Records, s.Pending)
	if len(s.Consumers) == 0 {
		t.Fatal("no consumer was counted")
	}
	for _, c := range s.Consumers {
		if c.Lost != 0 {
			t.Errorf("%s: %d committed records were never handled", c.Consumer, c.Lost)
		}
		if c.Handled != s.Records {
			t.Errorf("%s: handled %d distinct messages for %d records", c.Consumer, c.Handled, s.Records)
		}
		if c.OutOfOrder != 0 {
			t.Errorf("%s: %d handlings came after a handling of a later record of their key", c.Consumer, c.OutOfOrder)
		}
	}
}

// checkDrained fails the test unless records were committed and none is
// pending.
func checkDrained(t *testing.T, records, pending int) {
	t.Helper()
	if records == 0 {
		t.Fatal("no record was committed: the run proves nothing")
	}
	if pending != 0 {
		t.Errorf("%d records still pending after the final drain", pending)
	}
}
