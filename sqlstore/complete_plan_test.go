package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestCombinedCompletionPlanCachedOnAnEmptyTable: on PostgreSQL, the plan
// cached for the combined completion while its table is empty (a generic
// plan, which a connection keeps using as the table grows) finds each id by
// its primary key. With the ids joined to the table and the pending test
// beside the lookup, that plan read the whole pending index into a hash
// join, dead entries of completed records included, once per statement:
// at 16 publishers, 35 of the 55 rows read per delivered message.
func TestCombinedCompletionPlanCachedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	for _, c := range []struct {
		mode        sqlstore.Completion
		types, args string
	}{
		{sqlstore.Mark, "bigint[], text, text[]", "'{1,2,3,4}', 'handler', '{u,u,\"\",u}'"},
		{sqlstore.Delete, "bigint[], text[]", "'{1,2,3,4}', '{u,u,\"\",u}'"},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			s := testenv.NewStore(t, testenv.Backends()[0], db, c.mode)
			_, many, _, _ := sqlstore.CompletionStatements(s)
			text := genericPlan(t, db, many, c.types, c.args)
			assert.Contains(t, text, "_pkey", text)
			assert.Contains(t, text, "TID Cond", text, "the row is written where its lookup found it")
			assert.NotContains(t, text, "_pending", text)
			assert.NotContains(t, text, "Seq Scan", text)
			assert.NotContains(t, text, "Hash", text)
		})
	}
}

// TestSingleCompletionPlanCachedOnAnEmptyTable: on PostgreSQL, the plan
// cached for the completion of one record on the coalesced path, made
// while the table is empty, finds the record by its primary key, never
// through the pending index (topic, id), which it would read whole.
func TestSingleCompletionPlanCachedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	for _, c := range []struct {
		mode        sqlstore.Completion
		types, args string
	}{
		{sqlstore.Mark, "text, bigint, text, text", "'handler', 5, 'u', 'u'"},
		{sqlstore.Delete, "bigint, text, text", "5, 'u', 'u'"},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			s := testenv.NewStore(t, testenv.Backends()[0], db, c.mode)
			text := genericPlan(t, db, sqlstore.UnheldCompletionStatement(s), c.types, c.args)
			assert.Contains(t, text, "_pkey", text)
			assert.Contains(t, text, "TID Cond", text, "the row is written where its lookup found it")
			assert.NotContains(t, text, "_pending", text)
			assert.NotContains(t, text, "Seq Scan", text)
		})
	}
}

// TestOrderStatementsPlanCachedOnAnEmptyTable: on PostgreSQL, the plans
// cached for Predecessors and WaitingKeys while the table is empty (generic
// plans, which a connection keeps as the table grows) look each record up
// by its primary key and each key up in the order index. With the ids and
// keys listed in the statement, a plan made on a small table read the
// whole table once per publish, dead rows of completed records included.
func TestOrderStatementsPlanCachedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
		t.Run(mode.String(), func(t *testing.T) {
			s := testenv.NewStore(t, testenv.Backends()[0], db, mode)
			predecessors, waitingKeys := sqlstore.OrderStatements(s)
			text := genericPlan(t, db, predecessors, "text, bigint[]", "'orders', '{1,2,3}'")
			assert.Contains(t, text, "_pkey", text)
			assert.Contains(t, text, "_order", text)
			assert.NotContains(t, text, "Seq Scan", text)
			for _, query := range sqlstore.PredecessorMessagesStatements(s) {
				text := genericPlan(t, db, query, "text, bigint[]", "'orders', '{1,2,3}'")
				assert.Contains(t, text, "_pkey", text)
				assert.Contains(t, text, "_order", text)
				assert.NotContains(t, text, "Seq Scan", text)
			}
			text = genericPlan(t, db, waitingKeys, "text, bigint, text[]", "'orders', 250000, '{a,b}'")
			assert.Contains(t, text, "_order", text)
			assert.NotContains(t, text, "Seq Scan", text)
			assert.NotContains(t, text, "Hash", text)
		})
	}
}
