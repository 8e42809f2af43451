package outboxui_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestOverviewDoesNotGrowWithServerAge serves many overviews from one
// handler on one long-lived PostgreSQL connection, as a dashboard that has
// run for a while does. PostgreSQL plans a prepared statement with its
// parameters' values for five executions, then may switch to a generic
// plan that knows no value: a time window as a parameter was planned as a
// third of the table, and the overview grew slow with the connection's
// age. Every page sends the same statements; none of them has a generic
// plan much costlier than its plan for the values sent; the later pages
// are not slower than the first ones.
func TestOverviewDoesNotGrowWithServerAge(t *testing.T) {
	db, counter := testenv.CountingPostgres(t)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	s := testenv.NewStore(t, backend(t, "Postgres"), db, sqlstore.Mark)
	fillTable(t, db, s.Table(), 30_000)
	ui, err := outboxui.New(s, outboxui.Config{}, nil)
	require.NoError(t, err)

	const pages = 40
	took := make([]time.Duration, pages)
	var sent [][]testenv.Statement
	for i := range pages {
		before := len(counter.Statements())
		start := time.Now()
		w := httptest.NewRecorder()
		ui.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		took[i] = time.Since(start)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		sent = append(sent, counter.Statements()[before:])
	}
	for i, stmts := range sent {
		require.Len(t, stmts, len(sent[0]), "page %d sent %d statements, the first %d", i+1, len(stmts), len(sent[0]))
	}

	// The plans that a long-lived connection ends up with: each statement's
	// generic plan, against its plan for the values the last page sent.
	ctx := testCtx(t)
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	defer conn.Close()
	for i, st := range sent[pages-1] {
		if !strings.HasPrefix(strings.TrimSpace(st.SQL), "SELECT") {
			continue
		}
		name := fmt.Sprintf("server_age_%d", i)
		_, err := conn.ExecContext(ctx, "PREPARE "+name+" AS "+st.SQL)
		require.NoError(t, err, st.SQL)
		execute := "EXECUTE " + name
		var lits []string
		for _, a := range st.Args {
			switch a.(type) {
			case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryExecMode:
				continue // options of pgx's database/sql driver, not values
			}
			lits = append(lits, literal(t, a))
		}
		if len(lits) > 0 {
			execute += "(" + strings.Join(lits, ", ") + ")"
		}
		cost := func(mode string) float64 {
			_, err := conn.ExecContext(ctx, "SET plan_cache_mode = "+mode)
			require.NoError(t, err)
			var plan string
			require.NoError(t, conn.QueryRowxContext(ctx, "EXPLAIN (FORMAT JSON) "+execute).Scan(&plan))
			var p []struct {
				Plan struct {
					TotalCost float64 `json:"Total Cost"`
				}
			}
			require.NoError(t, json.Unmarshal([]byte(plan), &p))
			return p[0].Plan.TotalCost
		}
		custom, generic := cost("force_custom_plan"), cost("force_generic_plan")
		assert.LessOrEqual(t, generic, 4*custom+100, "the generic plan of\n%s\ncosts %.0f, its plan for the values sent %.0f", st.SQL, generic, custom)
		_, err = conn.ExecContext(ctx, "DEALLOCATE "+name)
		require.NoError(t, err)
	}
	_, err = conn.ExecContext(ctx, "RESET plan_cache_mode")
	require.NoError(t, err)

	// The first five pages run on plans for their values; the last ten on
	// whatever the connection settled on.
	early, late := median(took[:5]), median(took[pages-10:])
	assert.LessOrEqual(t, late, 4*early, "the last pages took %v (median), the first %v", late, early)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// literal writes an argument of a traced statement as an SQL literal.
func literal(t *testing.T, a any) string {
	switch v := a.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case int, int32, int64:
		return fmt.Sprint(v)
	}
	t.Fatalf("no literal for %T", a)
	return ""
}
