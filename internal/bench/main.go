// Command bench measures the outbox beside what it is compared with, in one
// run on one machine: a bare Watermill router on GoChannel, raw SQL on the
// same connection pool, and Watermill's classic outbox (watermill-sql
// publisher in a transaction plus components/forwarder). It prints the
// machine, a table of absolute figures and the ratios the project's targets
// are stated in.
//
//	go run ./internal/bench -db postgres
//	go run ./internal/bench -db postgres,mariadb,sqlite
//	go run ./internal/bench -db postgres,sqlite -tiny   # seconds; every case, tiny sizes
//	go run ./internal/bench -cases saturated -publishers 4   # one publisher count alone
//
// It needs PostgreSQL at OUTBOX_TEST_POSTGRES_DSN (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and, for -db
// mariadb, MariaDB at OUTBOX_TEST_MYSQL_DSN (default
// root@tcp(127.0.0.1:3306)/test?interpolateParams=true); SQLite runs on a
// file in a temporary directory. The remote case puts its receiving service
// in a second database (the DSN's name with "_b", created when missing) and
// runs on RabbitMQ at OUTBOX_TEST_AMQP_URI (default
// amqp://guest:guest@127.0.0.1:5672/) when it is reachable. Figures depend on the machine and on what
// else runs on it: compare ratios from one run, not figures across runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/internal/testenv"
)

// options are the command's flags.
type options struct {
	dbs      []string
	duration time.Duration
	rounds   int
	// routerRounds and routerDuration are for the router cases, whose
	// per-message cost is microseconds, so that noise matters more: many
	// short rounds even it out.
	routerRounds   int
	routerDuration time.Duration
	window         int
	pacedN         int
	// saturatedN is how many messages each publisher sends in the
	// saturated case, which runs saturatedRounds rounds.
	saturatedN      int
	saturatedRounds int
	// stall ends an end-to-end case in which nothing was handled for that
	// long; defaultStall in the program.
	stall      time.Duration
	pacedRate  int
	replayRows int
	// scaleRows is how many completed records the scale case fills its
	// table with.
	scaleRows int
	// partitionRows is how many completed records the partitioned scale
	// case (PostgreSQL) fills its first partition with.
	partitionRows int
	dsn           dsns
	cases         map[string]bool
	// inFlight is Coalescing.MaxInFlight of the default cases; 0 keeps
	// sqlstore's default.
	inFlight int
	// publishers are the publisher counts the cases that compare
	// concurrencies run at; publisherCounts gives the default when empty.
	publishers []int
	// cleanerPause is CleanerConfig.Pause of the scale case's Cleaner.
	cleanerPause time.Duration
	// amqpURI is the RabbitMQ of the remote case's order-keeping broker.
	amqpURI string
}

// defaultPublishers are the publisher counts of the tables.
var defaultPublishers = []int{1, 4, 16}

// publisherCounts are the counts the concurrency cases loop over.
func (o options) publisherCounts() []int {
	if len(o.publishers) == 0 {
		return defaultPublishers
	}
	return o.publishers
}

// caseGroups are the groups -cases selects from, in the order they run.
var caseGroups = []string{"router", "publish", "batch", "latency-bound", "saturated", "ordered", "remote", "paced", "replay", "scale"}

func (o options) runs(group string) bool { return o.cases == nil || o.cases[group] }

func main() {
	var o options
	dbs := flag.String("db", "postgres", "databases to run on, comma-separated: postgres, mariadb, sqlite")
	flag.DurationVar(&o.duration, "duration", 1500*time.Millisecond, "how long each throughput case runs")
	flag.IntVar(&o.rounds, "rounds", 5, "how many times each pair of compared cases runs, alternating; the median is reported")
	flag.IntVar(&o.routerRounds, "router-rounds", 15, "rounds of the router cases (bare router, untracked)")
	flag.DurationVar(&o.routerDuration, "router-duration", 500*time.Millisecond, "how long each router case runs per round")
	flag.IntVar(&o.window, "window", 32, "latency-bound end to end: messages one publisher may have published but not yet handled")
	flag.IntVar(&o.saturatedN, "saturated", 10_000, "saturated: messages each publisher sends, with no cap in flight")
	flag.IntVar(&o.saturatedRounds, "saturated-rounds", 3, "rounds of the saturated case")
	flag.IntVar(&o.pacedN, "paced", 3000, "messages sent in the paced latency cases")
	flag.IntVar(&o.pacedRate, "rate", 500, "messages per second in the paced latency cases")
	flag.IntVar(&o.replayRows, "replay", 1_000_000, "pending rows replayed in the replay case")
	flag.IntVar(&o.scaleRows, "scale-rows", 10_000_000, "completed records in the full table of the scale case")
	flag.IntVar(&o.partitionRows, "partition-rows", 10_000_000, "completed records in the old partition of the scale case's partitioned table (PostgreSQL)")
	flag.StringVar(&o.dsn.postgres, "postgres-dsn", testenv.PostgresDSN(), "PostgreSQL DSN")
	flag.StringVar(&o.dsn.mysql, "mysql-dsn", testenv.MySQLDSN(), "MariaDB DSN (go-sql-driver/mysql, with interpolateParams=true)")
	flag.StringVar(&o.amqpURI, "amqp-uri", amqpURI(), "RabbitMQ of the remote case (OUTBOX_TEST_AMQP_URI)")
	publishers := flag.String("publishers", "1,4,16", "publisher counts of the publish, latency-bound and saturated cases, comma-separated")
	cases := flag.String("cases", "", "only these groups, comma-separated: "+strings.Join(caseGroups, ", ")+" (default all)")
	flag.DurationVar(&o.cleanerPause, "cleaner-pause", 0, "CleanerConfig.Pause of the scale case's Cleaner (0: its default, as long as each batch took; negative: none)")
	flag.IntVar(&o.inFlight, "inflight", 0, "Coalescing.MaxInFlight of the default cases (0: sqlstore's default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	tiny := flag.Bool("tiny", false, "a run of seconds that checks every case works (sizes: duration 100ms, 1 round, 200 saturated, 50 paced, 5000 replayed, 20000 scale rows)")
	flag.Parse()
	o.stall = defaultStall
	if *tiny {
		o.duration, o.rounds, o.routerRounds, o.routerDuration, o.pacedN, o.replayRows = 100*time.Millisecond, 1, 1, 100*time.Millisecond, 50, 5000
		o.saturatedN, o.saturatedRounds, o.scaleRows, o.partitionRows = 200, 1, 20_000, 20_000
	}
	o.dbs = strings.Split(*dbs, ",")
	var err error
	if o.publishers, err = parsePublishers(*publishers); err != nil {
		log.Fatal(err)
	}
	if *cases != "" {
		o.cases = map[string]bool{}
		for _, c := range strings.Split(*cases, ",") {
			if !slices.Contains(caseGroups, c) {
				log.Fatalf("unknown case group %q (%s)", c, strings.Join(caseGroups, ", "))
			}
			o.cases[c] = true
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(context.Background(), os.Stdout, o); err != nil {
		pprof.StopCPUProfile()
		log.Fatal(err)
	}
}

// amqpURI is OUTBOX_TEST_AMQP_URI, or RabbitMQ on this machine.
func amqpURI() string {
	if uri := os.Getenv("OUTBOX_TEST_AMQP_URI"); uri != "" {
		return uri
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// parsePublishers reads -publishers: positive counts, comma-separated.
func parsePublishers(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-publishers: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, out io.Writer, o options) error {
	m := describeMachine()
	fmt.Fprintf(out, "# outbox benchmarks\n\n")
	fmt.Fprintf(out, "command: go run ./internal/bench %s\n", strings.Join(os.Args[1:], " "))
	m.print(out)
	if o.runs("router") {
		fmt.Fprintf(out, "\n## Router, no database\n\n")
		rep, err := runRouterSuite(ctx, o)
		if err != nil {
			return err
		}
		rep.print(out)
	}
	for _, name := range o.dbs {
		d, err := openDatabase(ctx, strings.TrimSpace(name), o.dsn)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\n## %s (%s)\n\n", d.name, d.version)
		if line := d.costSource(ctx); line != "" {
			fmt.Fprintf(out, "%s\n\n", line)
		}
		rep, err := runSuite(ctx, d, o)
		d.close()
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		rep.print(out)
	}
	fmt.Fprintf(out, "\nload average at the end: %s; %s\n", loadAverage(), pressure())
	return nil
}
