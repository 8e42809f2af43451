package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// What a delivered message costs the database: counters read before and
// after an end-to-end case, their difference divided by the messages
// delivered. PostgreSQL and MariaDB count for the whole server, so that
// other work on it shows in them (the run prints the machine's load);
// the rows of PostgreSQL are those of the case's own tables, which no one
// else touches.

// counters are one reading of a database's counters, by costColumn.key.
type counters map[string]float64

// costColumn is one column of cost per message in the report.
type costColumn struct {
	key, title, format string
}

var (
	postgresCost = []costColumn{
		{"wal", "WAL B/msg", "%.0f"},
		{"commits", "commits/msg", "%.2f"},
		{"written", "rows written/msg", "%.2f"},
		{"read", "rows read/msg", "%.1f"},
		{"cpu", "DB CPU ms/msg", "%.3f"},
		{"own_cpu", "own backends CPU ms/msg", "%.3f"},
	}
	mariadbCost = []costColumn{
		{"wal", "redo B/msg", "%.0f"},
		{"commits", "commits/msg", "%.2f"},
		{"written", "rows written/msg", "%.2f"},
		{"read", "rows read/msg", "%.1f"},
		{"cpu", "DB CPU ms/msg", "%.3f"},
	}
	sqliteCost = []costColumn{
		{"wal", "bytes written/msg", "%.0f"},
	}
)

// costColumns are the cost columns of the database's saturated rows.
func (d *database) costColumns() []costColumn {
	switch d.name {
	case "postgres":
		return postgresCost
	case "mariadb":
		return mariadbCost
	}
	return sqliteCost
}

// benchApplication names the bench's own PostgreSQL connections.
const benchApplication = "outbox-bench"

// withApplicationName adds application_name to a PostgreSQL DSN (URL or
// key=value form) unless it has one.
func withApplicationName(dsn string) string {
	if strings.Contains(dsn, "application_name") {
		return dsn
	}
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "application_name=" + benchApplication
	}
	return dsn + " application_name=" + benchApplication
}

// ownTables selects the tables the cases create: the project's and the raw
// cases' (bench_…), and watermill-sql's (watermill_bench_fwd_…,
// watermill_offsets_bench_fwd_…).
const ownTables = `(t.relname LIKE 'bench\_%' OR t.relname LIKE 'watermill\_%bench\_fwd\_%')`

// readCounters reads the database's counters now.
func (d *database) readCounters(ctx context.Context) (counters, error) {
	c := counters{}
	switch d.name {
	case "postgres":
		var wal, commits, written, read float64
		if err := d.meter.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8, xact_commit::float8
FROM pg_stat_database WHERE datname = current_database()`).Scan(&wal, &commits); err != nil {
			return nil, fmt.Errorf("read PostgreSQL counters: %w", err)
		}
		// Rows read as pg_stat_database counts them (tup_returned +
		// tup_fetched): index entries and heap rows an index scan
		// returned, and rows a sequential scan read.
		if err := d.meter.QueryRowContext(ctx, `SELECT
  COALESCE(SUM(t.n_tup_ins + t.n_tup_upd + t.n_tup_del), 0)::float8,
  COALESCE(SUM(t.seq_tup_read + COALESCE(t.idx_tup_fetch, 0)
    + COALESCE((SELECT SUM(i.idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid), 0)), 0)::float8
FROM pg_stat_user_tables t WHERE `+ownTables).Scan(&written, &read); err != nil {
			return nil, fmt.Errorf("read PostgreSQL table counters: %w", err)
		}
		c["wal"], c["commits"], c["written"], c["read"] = wal, commits, written, read
		if err := d.accessPaths(ctx, c); err != nil {
			return nil, err
		}
	case "mariadb":
		rows, err := d.meter.QueryxContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_os_log_written', 'Handler_commit',
'Handler_write', 'Handler_update', 'Handler_delete', 'Handler_read_first', 'Handler_read_key', 'Handler_read_last',
'Handler_read_next', 'Handler_read_prev', 'Handler_read_rnd', 'Handler_read_rnd_next')`)
		if err != nil {
			return nil, fmt.Errorf("read MariaDB counters: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var name, value string
			if err := rows.Scan(&name, &value); err != nil {
				return nil, err
			}
			v, _ := strconv.ParseFloat(value, 64)
			switch {
			case name == "Innodb_os_log_written":
				c["wal"] += v
			case name == "Handler_commit":
				c["commits"] += v
			case strings.HasPrefix(name, "Handler_read"):
				c["read"] += v
			default:
				c["written"] += v
			}
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	case "sqlite":
		w, ok := processWrites()
		if !ok {
			return c, nil
		}
		c["wal"] = w
	}
	if d.serverPID > 0 {
		if cpu, ok := serverCPU(d.serverPID, d.name == "postgres"); ok {
			c["cpu"] = cpu
		}
	}
	return c, nil
}

// ownBackendsCPU is the CPU time, in milliseconds, of the backends of the
// bench's pool alive now: unlike the server's, no other client's work is in
// it, nor that of the server's background processes (the WAL writer, the
// checkpointer, autovacuum). A case's pool opens all its connections as
// it starts (openPool), after the previous case closed them all, and keeps
// them until it ends, so that the difference of two readings is the
// case's.
func (d *database) ownBackendsCPU(ctx context.Context) (float64, error) {
	var pids []int
	if err := d.meter.SelectContext(ctx, &pids, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", benchApplication); err != nil {
		return 0, fmt.Errorf("list the bench's backends: %w", err)
	}
	var total float64
	for _, pid := range pids {
		if f, ok := procStat(pid); ok {
			total += cpuOf(f)
		}
	}
	return total, nil
}

// accessPaths adds, by access path of the case's tables, the rows read:
// "path:seq" for sequential scans, "path:<index>" for index entries read
// through each index, named without its table's name.
func (d *database) accessPaths(ctx context.Context, c counters) error {
	rows, err := d.meter.QueryContext(ctx, `SELECT 'seq', COALESCE(SUM(t.seq_tup_read), 0)::float8 FROM pg_stat_user_tables t WHERE `+ownTables+`
UNION ALL
SELECT CASE WHEN t.relname LIKE 'watermill%' THEN 'watermill_' ELSE '' END
    || substr(i.indexrelname, length(i.relname) + 2), SUM(i.idx_tup_read)::float8
FROM pg_stat_user_indexes i JOIN pg_stat_user_tables t ON t.relid = i.relid WHERE `+ownTables+`
GROUP BY 1`)
	if err != nil {
		return fmt.Errorf("read PostgreSQL index counters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var path string
		var n float64
		if err := rows.Scan(&path, &n); err != nil {
			return err
		}
		c["path:"+path] = n
	}
	return rows.Err()
}

// pathNote says, for a row of PostgreSQL, the rows read per message by
// access path, largest first, those above 0.05.
func pathNote(per map[string]float64) string {
	type path struct {
		name string
		n    float64
	}
	var ps []path
	for k, v := range per {
		if name, ok := strings.CutPrefix(k, "path:"); ok && v >= 0.05 {
			ps = append(ps, path{name, v})
		}
	}
	if len(ps) == 0 {
		return ""
	}
	slices.SortFunc(ps, func(a, b path) int { return cmp.Compare(b.n, a.n) })
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("%s %.1f", p.name, p.n)
	}
	return "rows read/msg by path: " + strings.Join(parts, ", ")
}

// costSource says where the cost columns come from, and why PostgreSQL's
// rows read are by table and index rather than by statement when
// pg_stat_statements is not loaded.
func (d *database) costSource(ctx context.Context) string {
	cpu := "server CPU from /proc"
	if d.serverPID == 0 {
		cpu = "no server CPU: the server is not a process of this machine"
	}
	switch d.name {
	case "postgres":
		var preload string
		_ = d.meter.GetContext(ctx, &preload, "SHOW shared_preload_libraries")
		statements := "pg_stat_statements is not in shared_preload_libraries, so rows read are by table and index (the notes say by which)"
		if strings.Contains(preload, "pg_stat_statements") {
			statements = "pg_stat_statements is loaded; rows read are by table and index (the notes say by which)"
		}
		return "cost per delivered message: WAL from pg_current_wal_lsn(), commits from pg_stat_database (the whole database), rows of the case's own tables from pg_stat_user_tables and _indexes, " + cpu + "; " + statements + "."
	case "mariadb":
		return "cost per delivered message: SHOW GLOBAL STATUS (Innodb_os_log_written, Handler_commit, Handler_write/update/delete, Handler_read_*; the whole server), " + cpu + "."
	}
	return "cost per delivered message: the bytes this process wrote (/proc/self/io wchar), SQLite's WAL frames and checkpoints."
}

// findServer finds the database server's process on this machine, for its
// CPU time; 0 when it runs elsewhere or cannot be read.
func (d *database) findServer(ctx context.Context) {
	switch d.name {
	case "postgres":
		// The postmaster is the parent of every backend.
		var pid int
		if d.meter.GetContext(ctx, &pid, "SELECT pg_backend_pid()") != nil {
			return
		}
		if f, ok := procStat(pid); ok && len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				if _, ok := procStat(ppid); ok {
					d.serverPID = ppid
				}
			}
		}
	case "mariadb":
		var file string
		if d.meter.GetContext(ctx, &file, "SELECT @@pid_file") != nil {
			return
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			if _, ok := procStat(pid); ok {
				d.serverPID = pid
			}
		}
	}
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times on Linux.
const clockTicks = 100

// procStat is /proc/<pid>/stat's fields after the command's name: [0] is
// the state, [1] the parent's pid, [11] to [14] utime, stime, cutime and
// cstime.
func procStat(pid int) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	f := strings.Fields(s[i+1:])
	return f, len(f) > 14
}

// cpuOf is a process's user and system time, in milliseconds, with that of
// its children that exited and were waited for.
func cpuOf(f []string) float64 {
	var ticks float64
	for _, k := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseFloat(f[k], 64)
		ticks += v
	}
	return ticks * 1000 / clockTicks
}

// serverCPU is the server's CPU time in milliseconds. With children (the
// PostgreSQL postmaster), it adds that of every living child, so that a
// backend counts while it lives and, once it exits, in the postmaster's
// time of children that exited.
func serverCPU(pid int, children bool) (float64, bool) {
	f, ok := procStat(pid)
	if !ok {
		return 0, false
	}
	total := cpuOf(f)
	if !children {
		return total, true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	parent := strconv.Itoa(pid)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cf, ok := procStat(child); ok && cf[1] == parent {
			total += cpuOf(cf)
		}
	}
	return total, true
}

// processWrites is the bytes this process has written to files and sockets
// (/proc/self/io wchar): in the SQLite cases, SQLite's WAL frames and its
// checkpoints into the database file.
func processWrites() (float64, bool) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n, err == nil
		}
	}
	return 0, false
}

// meter measures one case's cost.
type meter struct {
	d      *database
	before counters
	err    error
}

func (d *database) newMeter() *meter { return &meter{d: d} }

// backendsGone bounds the wait for the backends of the pool to exit.
const backendsGone = 10 * time.Second

// closeBackends closes the pool's idle connections and waits until their
// PostgreSQL backends have exited: a backend reports its table and database
// counters as it exits, at once, where an idle one reports them within a
// second or, when the counters are busy, later; and once it exited, its CPU
// time is the postmaster's. The next case opens its connections again.
func (d *database) closeBackends(ctx context.Context) error {
	var pids []int
	if err := d.meter.SelectContext(ctx, &pids, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", benchApplication); err != nil {
		return fmt.Errorf("list the bench's backends: %w", err)
	}
	d.db.SetMaxIdleConns(0)
	defer d.db.SetMaxIdleConns(poolSize)
	deadline := time.Now().Add(backendsGone)
	for _, pid := range pids {
		for {
			// A backend that exited is gone from /proc once the
			// postmaster waited for it.
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("backend %d of the bench did not exit within %v", pid, backendsGone)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// start opens the pool's connections and reads the counters as the case
// starts.
func (m *meter) start(ctx context.Context) {
	if m.err = m.d.openPool(ctx); m.err != nil {
		return
	}
	m.before, m.err = m.d.readCounters(ctx)
	if m.err == nil {
		m.err = m.readOwnCPU(ctx, m.before)
	}
}

// openPool opens every connection of the pool on PostgreSQL, so that the
// case finds them open, as a service's pool is once it has run a while:
// a backend's start costs the server milliseconds of CPU (5 to 8 ms
// measured), and its exit more (stop), which a case that opens more
// connections than another, because it runs more statements at once,
// would otherwise count as if its messages cost it.
func (d *database) openPool(ctx context.Context) error {
	if d.name != "postgres" {
		return nil
	}
	conns := make([]*sql.Conn, 0, poolSize)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range poolSize {
		c, err := d.db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("open the pool's connections: %w", err)
		}
		conns = append(conns, c)
		if err := c.PingContext(ctx); err != nil {
			return fmt.Errorf("open the pool's connections: %w", err)
		}
	}
	return nil
}

// readOwnCPU adds the CPU time of the bench's own backends on PostgreSQL,
// while they are alive.
func (m *meter) readOwnCPU(ctx context.Context, c counters) error {
	if m.d.name != "postgres" || m.d.serverPID == 0 {
		return nil
	}
	own, err := m.d.ownBackendsCPU(ctx)
	c["own_cpu"] = own
	return err
}

// stop reads them once the case is over and every message delivered, and
// divides the difference by delivered.
func (m *meter) stop(ctx context.Context, delivered int64) (map[string]float64, error) {
	if m.err != nil {
		return nil, m.err
	}
	own := counters{}
	if err := m.readOwnCPU(ctx, own); err != nil {
		return nil, err
	}
	if m.d.name == "postgres" {
		// The server's CPU is read before the backends exit: an exit
		// costs the server about 20 ms of CPU (measured on PostgreSQL
		// 15, 40 backends), which no message causes.
		if m.d.serverPID > 0 {
			if cpu, ok := serverCPU(m.d.serverPID, true); ok {
				own["cpu"] = cpu
			}
		}
		if err := m.d.closeBackends(ctx); err != nil {
			return nil, err
		}
	}
	after, err := m.d.readCounters(ctx)
	if err != nil {
		return nil, err
	}
	maps.Copy(after, own)
	per := map[string]float64{}
	for k, v := range after {
		if b, ok := m.before[k]; ok && delivered > 0 {
			per[k] = (v - b) / float64(delivered)
		}
	}
	return per, nil
}

// openMeter opens the connection the counters are read on: apart from the
// pool of the cases, so that reading them never waits for one.
func (d *database) openMeter(ctx context.Context, driver, dsn string) error {
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	d.meter = db
	d.findServer(ctx)
	return nil
}

// costCells formats a row's cost columns; empty cells where a counter is
// missing.
func costCells(cols []costColumn, per map[string]float64) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		if v, ok := per[c.key]; ok {
			out[i] = fmt.Sprintf(c.format, v)
		}
	}
	return out
}
