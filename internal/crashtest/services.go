package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
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
	// DrainTimeout bounds how long the final drain may go without a
	// record of A completing: a long ordered soak leaves a backlog that
	// takes longer to work off. Defaults to 2 minutes.
	DrainTimeout time.Duration
	// Keys, when not zero, runs the ordered variant: A's topic is ordered
	// by key (outbox.Tracked.OrderKey) and each start of A publishes,
	// until it is killed, messages of Keys keys drawn at random; each
	// start of B arms its kill point 1 to 3 seconds after it started, and
	// A's 3 to 8 seconds after, either killed at the first pass there or
	// a second later wherever it is; A is killed at least once. The
	// summary then checks each key's effects in B's database against the
	// order A saved its records in. Batch is then unused.
	Keys int
	// InstancesB is the number of B's processes, which share B's database
	// and its queue, each killed on its own. Defaults to 1.
	InstancesB int
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
	// Ordered is what an ordered run ([ServicesConfig.Keys]) found: each
	// key's effects in B's database, by position, against A's records.
	Ordered OrderSummary
	// Events counts the events of an ordered run's children (EventSend,
	// EventHeld...), those of killed children included.
	Events map[string]int
	// Took is how long the run took, the final drain included.
	Took time.Duration
}

// OrderSummary is the order of B's effects, key by key, in an ordered run.
type OrderSummary struct {
	// Keys counts the keys with an effect in B.
	Keys int
	// OutOfOrderKeys counts the keys with at least one effect that came
	// after an effect of a later record of the key (by A's record id),
	// OutOfOrder those effects.
	OutOfOrderKeys, OutOfOrder int
	// BadPositions counts the effects whose position within their key is
	// not one more than the one before: two effects of the key were
	// written at once, or one is missing.
	BadPositions int
}

// String is the order part of a summary line.
func (o OrderSummary) String() string {
	return fmt.Sprintf("keys=%d out_of_order_keys=%d out_of_order_effects=%d bad_positions=%d", o.Keys, o.OutOfOrderKeys, o.OutOfOrder, o.BadPositions)
}

// String is the summary line a test logs.
func (s ServicesSummary) String() string {
	line := fmt.Sprintf("kills=%d %v records=%d pending=%d (drained in %v); %s; effects of unknown messages=%d",
		total(s.Kills), s.Kills, s.Records, s.Pending, s.Drain.Round(time.Millisecond), s.B, s.Unknown)
	if s.Ordered.Keys > 0 {
		line += fmt.Sprintf("; %s; events %v; took %v", s.Ordered, s.Events, s.Took.Round(time.Second))
	}
	return line
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
	if _, err := dbB.Exec("CREATE TABLE " + EffectsTable + " (uuid VARCHAR(64) NOT NULL, k VARCHAR(64) NOT NULL, pos INTEGER NOT NULL)"); err != nil {
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
	// A service that passes no kill point in orderedGrace after its kill
	// point was armed is killed wherever it is.
	orderedGrace = time.Second
	// stallAfter fails a run in which neither service reached its kill
	// point for that long.
	stallAfter = 60 * time.Second
)

// In an ordered run each start of B arms its kill point after 1 to 3
// seconds, each of A after 3 to 8.
var orderedKillB, orderedKillA = [2]time.Duration{time.Second, 3 * time.Second}, [2]time.Duration{3 * time.Second, 8 * time.Second}

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
	a       *service
	bs      []*service // B's instances
	startsA int        // A's starts so far: each start's messages have UUIDs of their own
	events  map[string]int
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
	cfg.InstancesB = max(cfg.InstancesB, 1)
	began := time.Now()
	r := &servicesRun{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		a: &service{name: "A", test: cfg.ChildA, modes: modesA}, events: map[string]int{}}
	for range cfg.InstancesB {
		r.bs = append(r.bs, &service{name: "B", test: cfg.ChildB, modes: modesB})
	}
	defer r.stop()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s (seed %d)", fmt.Sprintf(format, args...), cfg.Seed)
	}

	// B first: its subscription declares its queue, which must be bound
	// before A's first message is sent. A declares its confirmation queue
	// before it publishes.
	for _, b := range r.bs {
		if err := r.startReady(b, r.plan(b)); err != nil {
			fail("first start of B: %v", err)
		}
	}
	if err := r.start(r.a, r.plan(r.a)); err != nil {
		fail("first start of A: %v", err)
	}
	sum := ServicesSummary{Kills: map[string]int{}}
	stall := time.NewTimer(stallAfter)
	defer stall.Stop()
	// An ordered run kills A at least once: B's kills come sooner.
	for n := 0; n < cfg.Kills || cfg.Keys > 0 && !killedA(sum.Kills); {
		s, line, ok, other := r.next(stall.C)
		if other == 0 {
			fail("after %d kills, no service reached its kill point (A %s, B %s) in %v", n, r.a.mode, r.bs[0].mode, stallAfter)
		}
		if !ok {
			fail("%s (%s): %v", s.name, s.mode, s.p.exited())
		}
		if line != "timer" && !strings.HasPrefix(line, "HALT") {
			continue
		}
		if err := r.kill(s); err != nil {
			fail("kill %s: %v", s.name, err)
		}
		point := string(s.mode)
		if line == "timer" && s.mode != Random {
			point += " (passed none)"
		}
		sum.Kills[s.name+"/"+point]++
		n++
		if err := r.start(s, r.plan(s)); err != nil {
			fail("restart %s: %v", s.name, err)
		}
		stall.Reset(stallAfter)
	}

	drained := time.Now()
	if err := r.drain(); err != nil {
		fail("final drain: %v", err)
	}
	sum.Drain = time.Since(drained)
	r.count(t, &sum)
	sum.Events, sum.Took = r.events, time.Since(began)
	return sum
}

func killedA(kills map[string]int) bool {
	for k, n := range kills {
		if strings.HasPrefix(k, "A/") && n > 0 {
			return true
		}
	}
	return false
}

// plan draws a service's next kill point.
type plan struct {
	mode  Mode
	at    int
	delay time.Duration
}

func (r *servicesRun) plan(s *service) plan {
	if r.cfg.Keys > 0 {
		span := orderedKillB
		if s == r.a {
			span = orderedKillA
		}
		return plan{mode: s.modes[r.rng.IntN(len(s.modes))], delay: span[0] + time.Duration(r.rng.Int64N(int64(span[1]-span[0])))}
	}
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
	ordered := r.cfg.Keys > 0 && p.mode != Drain
	if r.cfg.Keys > 0 {
		env = append(env, fmt.Sprintf("%s=%d", envKeys, r.cfg.Keys))
	}
	if ordered && p.mode != Random {
		env = append(env, fmt.Sprintf("%s=%d", envHaltAfter, p.delay.Milliseconds()))
	}
	proc, err := startProc(command(s.test, env...))
	if err != nil {
		return err
	}
	s.p, s.mode, s.timer = proc, p.mode, nil
	switch {
	case p.mode == Random:
		s.timer = time.After(p.delay)
	case ordered:
		s.timer = time.After(p.delay + orderedGrace)
	}
	return nil
}

// kill kills a service and adds up the events it counted.
func (r *servicesRun) kill(s *service) error {
	if err := s.p.kill(); err != nil {
		return err
	}
	for what, n := range s.p.tally() {
		r.events[what] += n
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
	for _, b := range r.bs {
		if err := r.startReady(b, plan{mode: Drain}); err != nil {
			return fmt.Errorf("B: %w", err)
		}
	}
	if err := r.start(r.a, plan{mode: Drain}); err != nil {
		return fmt.Errorf("A: %w", err)
	}
	stalled := time.NewTimer(r.cfg.DrainTimeout)
	defer stalled.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	pending, best := r.pendingQuery(), -1
	for {
		s, _, ok, other := r.next(tick.C, stalled.C)
		switch {
		case other < 0 && !ok:
			return fmt.Errorf("%s: %w", s.name, s.p.exited())
		case other == 0:
			var n int
			if err := r.cfg.DBA.Get(&n, pending); err != nil {
				return err
			}
			if n == 0 {
				r.stop()
				return nil
			}
			if best < 0 || n < best {
				best = n
				stalled.Reset(r.cfg.DrainTimeout)
			}
		case other == 1:
			var n int
			_ = r.cfg.DBA.Get(&n, pending)
			return fmt.Errorf("%d records of A still pending, none completed for %v; A: %s\nB: %s", n, r.cfg.DrainTimeout, r.a.p.killedStderr(), r.bs[0].p.killedStderr())
		}
	}
}

// next waits for a line of a service (ok false when its output ended), a
// service's kill timer (line "timer"), or one of others, whose index it
// returns then; -1 otherwise.
func (r *servicesRun) next(others ...<-chan time.Time) (s *service, line string, ok bool, other int) {
	all := r.all()
	cases := make([]reflect.SelectCase, 0, 2*len(all)+len(others))
	for _, s := range all {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.p.lines)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.timer)})
	}
	for _, c := range others {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	i, v, ok := reflect.Select(cases)
	switch {
	case i >= 2*len(all):
		return nil, "", ok, i - 2*len(all)
	case i%2 == 1:
		return all[i/2], "timer", true, -1
	case !ok:
		return all[i/2], "", false, -1
	}
	return all[i/2], v.String(), true, -1
}

// all is A and B's instances.
func (r *servicesRun) all() []*service { return append([]*service{r.a}, r.bs...) }

func (r *servicesRun) pendingQuery() string {
	return "SELECT COUNT(*) FROM " + r.cfg.Table + " WHERE processed_at IS NULL"
}

// stop kills the services that run.
func (r *servicesRun) stop() {
	for _, s := range r.all() {
		if s.p != nil {
			_ = r.kill(s)
			s.p, s.timer = nil, nil
		}
	}
}

// count reads A's records and B's effects; they live in two databases, so
// the join is done here.
func (r *servicesRun) count(t *testing.T, sum *ServicesSummary) {
	t.Helper()
	var records []struct {
		ID   int64  `db:"id"`
		UUID string `db:"uuid"`
	}
	if err := r.cfg.DBA.Select(&records, "SELECT id, uuid FROM "+r.cfg.Table); err != nil {
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
	ids := make(map[string]int64, len(records))
	for _, rec := range records {
		committed[rec.UUID] = true
		ids[rec.UUID] = rec.ID
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
	if r.cfg.Keys > 0 {
		sum.Ordered = r.order(t, ids)
		sum.B.OutOfOrder = sum.Ordered.OutOfOrder
	}
}

// order reads B's effects key by key, in the order of the positions B
// wrote them at, and counts those that follow an effect of a later record
// of their key: the order A saved them in is the order of its record ids,
// for each start of A publishes from one goroutine and the next start
// comes after the kill.
func (r *servicesRun) order(t *testing.T, ids map[string]int64) OrderSummary {
	t.Helper()
	var effects []struct {
		UUID string `db:"uuid"`
		Key  string `db:"k"`
		Pos  int    `db:"pos"`
	}
	if err := r.cfg.DBB.Select(&effects, "SELECT uuid, k, pos FROM "+EffectsTable+" ORDER BY k, pos"); err != nil {
		t.Fatal(err)
	}
	var o OrderSummary
	type keyState struct {
		next int   // the position the next effect should have
		last int64 // the highest record id so far
		bad  bool
	}
	keys := map[string]*keyState{}
	for _, e := range effects {
		k := keys[e.Key]
		if k == nil {
			k = &keyState{}
			keys[e.Key] = k
		}
		if e.Pos != k.next {
			o.BadPositions++
		}
		k.next = e.Pos + 1
		id, ok := ids[e.UUID]
		switch {
		case !ok: // counted as unknown
		case id < k.last:
			o.OutOfOrder++
			k.bad = true
		default:
			k.last = id
		}
	}
	o.Keys = len(keys)
	for _, k := range keys {
		if k.bad {
			o.OutOfOrderKeys++
		}
	}
	return o
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

// CheckServicesOrdered is [CheckServices] for an ordered run, which also
// fails unless each key's effects in B follow the order of A's records,
// one position after the other.
func CheckServicesOrdered(t *testing.T, s ServicesSummary) {
	t.Helper()
	CheckServices(t, s)
	if s.Ordered.Keys == 0 {
		t.Fatal("B has no effect of an order key: the run proves nothing about order")
	}
	if s.Ordered.OutOfOrderKeys != 0 {
		t.Errorf("%d of %d keys have effects in B out of the order A saved them in (%d effects)", s.Ordered.OutOfOrderKeys, s.Ordered.Keys, s.Ordered.OutOfOrder)
	}
	if s.Ordered.BadPositions != 0 {
		t.Errorf("%d effects in B are not one position after the one before in their key", s.Ordered.BadPositions)
	}
}
