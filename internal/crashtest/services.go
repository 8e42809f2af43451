package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/sqlstore"
)

// ServicesConfig configures [RunServices]: two services, each a child
// process with a database of its own, that meet only on the broker.
type ServicesConfig struct {
	// ChildA and ChildB are the names of the test functions that call
	// [ServiceA] and [ServiceB].
	ChildA, ChildB string
	// Kills is the number of SIGKILLs, of one service or the other.
	Kills int
	// Batch is the number of messages each start of A publishes.
	Batch int
	// Seed seeds the choice of kill points; print it to replay a failure.
	Seed uint64
	// DBA is A's database, for the final checks.
	DBA *sqlx.DB
	// Table is A's record table; A's topics are named after it ([Topics]).
	Table string
	// DBB is B's database, for the final checks.
	DBB *sqlx.DB
	// Env is added to every child's environment (DSNs, broker names).
	Env []string
	// DrainTimeout bounds the final drain. Defaults to 2 minutes.
	DrainTimeout time.Duration
}

// ServicesSummary is what a [RunServices] run found.
type ServicesSummary struct {
	// Kills counts the kills by service and kill point ("A/after-insert").
	Kills map[string]int
	// Records counts A's committed records, Pending those still pending
	// after the final drain.
	Records, Pending int
	// B is what B's handler did, counted in B's database: Handlings are
	// its effect rows, Handled the distinct messages among them.
	B ConsumerSummary
	// Unknown counts B's effects of messages that A never committed.
	Unknown int
	// Drain is how long the final drain took.
	Drain time.Duration
}

// String is the summary line a test logs.
func (s ServicesSummary) String() string {
	return fmt.Sprintf("kills=%d %v records=%d pending=%d (drained in %v); %s; effects of unknown messages=%d",
		total(s.Kills), s.Kills, s.Records, s.Pending, s.Drain.Round(time.Millisecond), s.B, s.Unknown)
}

// PrepareServices creates A's record table in dbA and B's effect table and
// inbox in dbB, dropped when the test ends.
func PrepareServices(t *testing.T, dbA *sqlx.DB, dA *sqlstore.Dialect, table string, dbB *sqlx.DB, dB *sqlstore.Dialect) {
	t.Helper()
	prepareRecords(t, dbA, dA, table)
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: dB, DB: dbB, Table: InboxTable})
	if err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := dbB.Exec("CREATE TABLE " + EffectsTable + " (uuid VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = dbB.Exec("DROP TABLE IF EXISTS " + EffectsTable)
		_, _ = dbB.Exec("DROP TABLE IF EXISTS " + InboxTable)
		_, _ = dbB.Exec(dbB.Rebind("DELETE FROM "+sqlstore.VersionTable+" WHERE table_name = ?"), InboxTable)
	})
}

// The kill points of each service; [Random] kills after a random delay
// from the start, up to maxKillDelay.
var (
	modesA = []Mode{AfterInsert, BeforeMark, Random}
	modesB = []Mode{MidHandler, AfterCommit, Random}
)

const (
	maxKillDelay = 1500 * time.Millisecond
	// stallAfter fails a run in which neither service reached its kill
	// point for that long.
	stallAfter = 60 * time.Second
)

// service is one running child of [RunServices].
type service struct {
	name  string // "A" or "B"
	test  string
	modes []Mode
	p     *proc
	mode  Mode
	timer <-chan time.Time
}

type servicesRun struct {
	cfg     ServicesConfig
	rng     *rand.Rand
	a, b    *service
	startsA int // A's starts so far: each start's messages have UUIDs of their own
}

// RunServices runs A and B at once and SIGKILLs one of them cfg.Kills
// times: each start of a service draws its next kill point from the seed
// (one of its halt points and the how-many-th time it gets there, or a
// random delay), and whichever service reaches its kill point first is
// killed and restarted with a new one; the other runs on. So the victim of
// each kill is not drawn: both services always have a kill point armed,
// and a halted service is killed at once, so that neither waits on a
// halted peer. The seed fixes the kill points, not the timing, so a
// replayed seed repeats the plans, not necessarily the interleaving. Then
// it runs both without kill points until A has no pending record, and
// counts. The caller asserts on the summary ([CheckServices]).
func RunServices(t *testing.T, cfg ServicesConfig) ServicesSummary {
	t.Helper()
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 2 * time.Minute
	}
	r := &servicesRun{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		a: &service{name: "A", test: cfg.ChildA, modes: modesA}, b: &service{name: "B", test: cfg.ChildB, modes: modesB}}
	defer r.stop()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s (seed %d)", fmt.Sprintf(format, args...), cfg.Seed)
	}

	// B first: its subscription declares its queue, which must be bound
	// before A's first message is sent. A declares its confirmation queue
	// before it publishes.
	if err := r.startReady(r.b, r.plan(r.b)); err != nil {
		fail("first start of B: %v", err)
	}
	if err := r.start(r.a, r.plan(r.a)); err != nil {
		fail("first start of A: %v", err)
	}
	sum := ServicesSummary{Kills: map[string]int{}}
	stall := time.NewTimer(stallAfter)
	defer stall.Stop()
	for n := 0; n < cfg.Kills; {
		var s *service
		var line string
		ok := true
		select {
		case line, ok = <-r.a.p.lines:
			s = r.a
		case line, ok = <-r.b.p.lines:
			s = r.b
		case <-r.a.timer:
			s, line = r.a, "timer"
		case <-r.b.timer:
			s, line = r.b, "timer"
		case <-stall.C:
			fail("after %d kills, neither service reached its kill point (A %s, B %s) in %v", n, r.a.mode, r.b.mode, stallAfter)
		}
		if !ok {
			fail("%s (%s): %v", s.name, s.mode, s.p.exited())
		}
		if line != "timer" && !strings.HasPrefix(line, "HALT") {
			continue
		}
		if err := s.p.kill(); err != nil {
			fail("kill %s: %v", s.name, err)
		}
		sum.Kills[s.name+"/"+string(s.mode)]++
		n++
		if err := r.start(s, r.plan(s)); err != nil {
			fail("restart %s: %v", s.name, err)
		}
		stall.Reset(stallAfter)
	}

	began := time.Now()
	if err := r.drain(); err != nil {
		fail("final drain: %v", err)
	}
	sum.Drain = time.Since(began)
	r.count(t, &sum)
	return sum
}

// plan draws a service's next kill point.
type plan struct {
	mode  Mode
	at    int
	delay time.Duration
}

func (r *servicesRun) plan(s *service) plan {
	return plan{mode: s.modes[r.rng.IntN(len(s.modes))], at: r.rng.IntN(r.cfg.Batch),
		delay: time.Duration(r.rng.Int64N(int64(maxKillDelay)))}
}

// start starts a service that is to be killed at p.
func (r *servicesRun) start(s *service, p plan) error {
	cycle := 0
	if s == r.a {
		cycle = r.startsA
		r.startsA++
	}
	env := append(append([]string(nil), r.cfg.Env...),
		envMode+"="+string(p.mode),
		fmt.Sprintf("%s=%d", envAt, p.at),
		fmt.Sprintf("%s=%d", envCycle, cycle),
		fmt.Sprintf("%s=%d", envBatch, r.cfg.Batch),
		envTable+"="+r.cfg.Table,
	)
	proc, err := startProc(command(s.test, env...))
	if err != nil {
		return err
	}
	s.p, s.mode, s.timer = proc, p.mode, nil
	if p.mode == Random {
		s.timer = time.After(p.delay)
	}
	return nil
}

// startReady starts a service and waits until its router runs.
func (r *servicesRun) startReady(s *service, p plan) error {
	if err := r.start(s, p); err != nil {
		return err
	}
	deadline := time.After(stallAfter)
	for {
		select {
		case line, ok := <-s.p.lines:
			if !ok {
				return s.p.exited()
			}
			if line == "READY" {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("not running within %v: %s", stallAfter, s.p.killedStderr())
		}
	}
}

// drain kills both services, starts them without kill points (A publishes
// nothing new) and waits until A has no pending record, polling A's
// database: completion happens in A's process, which can only tell the
// parent through that table or its output.
func (r *servicesRun) drain() error {
	r.stop()
	if err := r.startReady(r.b, plan{mode: Drain}); err != nil {
		return fmt.Errorf("B: %w", err)
	}
	if err := r.start(r.a, plan{mode: Drain}); err != nil {
		return fmt.Errorf("A: %w", err)
	}
	deadline := time.After(r.cfg.DrainTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	pending := r.pendingQuery()
	for {
		select {
		case _, ok := <-r.a.p.lines:
			if !ok {
				return fmt.Errorf("A: %w", r.a.p.exited())
			}
		case _, ok := <-r.b.p.lines:
			if !ok {
				return fmt.Errorf("B: %w", r.b.p.exited())
			}
		case <-tick.C:
			var n int
			if err := r.cfg.DBA.Get(&n, pending); err != nil {
				return err
			}
			if n == 0 {
				r.stop()
				return nil
			}
		case <-deadline:
			var n int
			_ = r.cfg.DBA.Get(&n, pending)
			return fmt.Errorf("%d records of A still pending after %v; A: %s\nB: %s", n, r.cfg.DrainTimeout, r.a.p.killedStderr(), r.b.p.killedStderr())
		}
	}
}

func (r *servicesRun) pendingQuery() string {
	return "SELECT COUNT(*) FROM " + r.cfg.Table + " WHERE processed_at IS NULL"
}

// stop kills the services that run.
func (r *servicesRun) stop() {
	for _, s := range []*service{r.a, r.b} {
		if s.p != nil {
			_ = s.p.kill()
			s.p, s.timer = nil, nil
		}
	}
}

// count reads A's records and B's effects; they live in two databases, so
// the join is done here.
func (r *servicesRun) count(t *testing.T, sum *ServicesSummary) {
	t.Helper()
	var records []string
	if err := r.cfg.DBA.Select(&records, "SELECT uuid FROM "+r.cfg.Table); err != nil {
		t.Fatal(err)
	}
	if err := r.cfg.DBA.Get(&sum.Pending, r.pendingQuery()); err != nil {
		t.Fatal(err)
	}
	var effects []struct {
		UUID string `db:"uuid"`
		N    int    `db:"n"`
	}
	if err := r.cfg.DBB.Select(&effects, "SELECT uuid, COUNT(*) AS n FROM "+EffectsTable+" GROUP BY uuid"); err != nil {
		t.Fatal(err)
	}
	sum.Records = len(records)
	sum.B = ConsumerSummary{Consumer: ConsumerB, Handled: len(effects)}
	committed := make(map[string]bool, len(records))
	for _, u := range records {
		committed[u] = true
	}
	for _, e := range effects {
		sum.B.Handlings += e.N
		if committed[e.UUID] {
			delete(committed, e.UUID)
		} else {
			sum.Unknown++
		}
	}
	sum.B.Duplicates = sum.B.Handlings - sum.B.Handled
	sum.B.Lost = len(committed)
}

// CheckServices fails the test unless A committed records, none is
// pending, B has exactly one effect for each of them and no other.
func CheckServices(t *testing.T, s ServicesSummary) {
	t.Helper()
	checkDrained(t, s.Records, s.Pending)
	if s.B.Lost != 0 {
		t.Errorf("%d committed records of A have no effect in B", s.B.Lost)
	}
	// B's effect and its inbox entry commit in one transaction, and a copy
	// whose entry exists rolls back: no kill can leave two effects.
	if s.B.Duplicates != 0 {
		t.Errorf("%d effects in B beyond one per message", s.B.Duplicates)
	}
	if s.Unknown != 0 {
		t.Errorf("%d effects in B of messages A never committed", s.Unknown)
	}
}
