// Package crashtest runs a service that publishes and handles tracked
// messages as a real child process, kills it with SIGKILL at chosen or random
// moments, restarts it, and checks at the end that no committed record was
// lost.
//
// A test binary calls [Run] in the parent test and [Child] from a test that
// only does something when the [EnvChild] variable is set, so that the test
// binary re-executed is the service.
package crashtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
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
)

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
	// Env is added to every child's environment (DSNs, broker names).
	Env []string
}

// Summary is what a run found.
type Summary struct {
	Kills      map[Mode]int
	Records    int // committed records
	Handled    int // distinct records handled
	Handlings  int // handler runs recorded
	Duplicates int // Handlings - Handled
	Lost       int // committed records never handled
	Pending    int // records still pending after the final drain
}

func (s Summary) String() string {
	return fmt.Sprintf("kills=%d %v records=%d handled=%d handlings=%d duplicates=%d lost=%d pending=%d",
		s.totalKills(), s.Kills, s.Records, s.Handled, s.Handlings, s.Duplicates, s.Lost, s.Pending)
}

func (s Summary) totalKills() int {
	n := 0
	for _, k := range s.Kills {
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
		at := rng.IntN(cfg.Batch)
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
	cmd := exec.Command(os.Args[0], "-test.run=^"+cfg.ChildTest+"$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.Env = append(cmd.Env,
		EnvChild+"="+cfg.ChildTest,
		envMode+"="+string(mode),
		fmt.Sprintf("%s=%d", envAt, at),
		fmt.Sprintf("%s=%d", envCycle, cycle),
		fmt.Sprintf("%s=%d", envBatch, cfg.Batch),
		envTable+"="+cfg.Table,
	)
	return cmd
}

// killCycle starts a child and kills it with SIGKILL at its halt line, at its
// idle line, or after delay in Random mode.
func killCycle(t *testing.T, cfg Config, cycle int, mode Mode, at int, delay time.Duration) error {
	cmd := childCmd(cfg, cycle, mode, at)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := make(chan string, 16)
	go scanLines(out, lines)

	var timer <-chan time.Time
	if mode == Random {
		timer = time.After(delay)
	}
	deadline := time.After(60 * time.Second)
	reason := ""
wait:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				return fmt.Errorf("child exited before it was killed: %s", tail(stderr.String()))
			}
			if strings.HasPrefix(line, "HALT") || line == "IDLE" {
				reason = line
				break wait
			}
		case <-timer:
			reason = "timer"
			break wait
		case <-deadline:
			reason = "deadline"
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("child neither halted nor idled within 60s: %s", tail(stderr.String()))
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		return fmt.Errorf("kill (%s): %w", reason, err)
	}
	_ = cmd.Wait()
	for range lines { // drain the scanner
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
	sum.Handlings = q("SELECT COUNT(*) FROM " + handled)
	sum.Handled = q("SELECT COUNT(DISTINCT uuid) FROM " + handled)
	sum.Lost = q("SELECT COUNT(*) FROM " + cfg.Table + " r WHERE NOT EXISTS (SELECT 1 FROM " + handled + " h WHERE h.uuid = r.uuid)")
	sum.Duplicates = sum.Handlings - sum.Handled
}

func scanLines(r io.Reader, lines chan<- string) {
	defer close(lines)
	s := bufio.NewScanner(r)
	for s.Scan() {
		lines <- s.Text()
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}

// Check fails the test unless every committed record was handled and none is
// pending.
func Check(t *testing.T, s Summary) {
	t.Helper()
	if s.Records == 0 {
		t.Fatal("no record was committed: the run proves nothing")
	}
	if s.Lost != 0 {
		t.Errorf("%d committed records were never handled", s.Lost)
	}
	if s.Pending != 0 {
		t.Errorf("%d records still pending after the final drain", s.Pending)
	}
	if s.Handled != s.Records {
		t.Errorf("handled %d distinct messages for %d records", s.Handled, s.Records)
	}
}
