package sqlstore

import (
	"fmt"
	"time"
)

// queries are the store's statements, built once per store from the
// validated, quoted table names; the store methods only execute them.
// Statements whose text depends on a number of ids (IN lists) start from a
// prefix kept here.
type queries struct {
	table     string // quoted
	consumers string // quoted <table>_consumers
	mark      bool   // the table keeps completed records (Mark)

	// insert saves records without an Origin; insertKeyed saves batches
	// in which some have one, with the origin column. savedOrigins is the
	// prefix, ending in "origin IN ", that reads the saved records of
	// some origins.
	insert       insertStatements
	insertKeyed  insertStatements
	savedOrigins string
	// insertDeliveries is the VALUES prefix of the delivery rows of
	// records saved with consumers; setConsumers the prefix, ending in
	// "id IN ", that records their count.
	insertDeliveries string
	setConsumers     string

	// state reads, in one round trip, what CheckPending decides from: the
	// record (with the UUID it was saved with) and the delivery row of one
	// consumer. stateMany reads it for
	// many deliveries at once, each row led by its delivery's id and
	// consumer; "" when the dialect cannot pass them as arrays.
	state     string
	stateMany string
	// order holds their twins for ordered deliveries (order.go).
	order orderQueries
	// claimRecord and claimDelivery take a delivery lease (Config.Lease)
	// of a record without consumers, or of one consumer's delivery.
	claimRecord   string
	claimDelivery string
	// releaseRecord and releaseDelivery give a lease up, only with the
	// token that took it.
	releaseRecord   string
	releaseDelivery string

	// complete completes a record without consumers in the caller's
	// transaction (CompleteTx); completeAlone is the same statement run on
	// its own (the single path of Complete), which on a dialect with a lazy
	// commit does not wait for the disk; completeMany, or completeIn
	// followed by the ids, many of them, on their own too.
	complete      string
	completeAlone string
	completeMany  string
	completeIn    string
	// lockIn, followed by ids, and writeIn, with its {ids} and
	// {consumer} filled, are the combined completion of a dialect without
	// RETURNING (lockedCompleteMany): the first locks the pending rows
	// without consumers that no other transaction holds, the second
	// completes the rows it locked.
	lockIn  string
	writeIn string
	// completeUnheld is completeAlone skipping a row that another
	// transaction may hold (a CompleteTx still open), so that the
	// coalesced path never waits for one: "" where the dialect has none
	// (Dialect.completeOneMarkSQL).
	completeUnheld string
	// lockRecord writes the row of a record with consumers without
	// changing it, so that concurrent completions of its deliveries
	// serialize on it on every database; completeDelivery completes one
	// delivery; deliveries reads the state of every delivery of a record;
	// finishRecord, dropDeliveries and abandonRecord roll the record up
	// once none of its deliveries is pending.
	// lockRecordAlone is lockRecord in a transaction of the store's own,
	// with the lazy commit.
	lockRecord       string
	lockRecordAlone  string
	completeDelivery string
	deliveries       string
	finishRecord     string
	dropDeliveries   string
	abandonRecord    string
	// adoptLock, adoptRead, adoptHave and adoptCount give a record the
	// deliveries of consumers its topic declares now (adopt.go).
	adoptLock  string
	adoptRead  string
	adoptHave  string
	adoptCount string
	// retireSelect picks a batch of one consumer's pending deliveries of
	// a topic (retire.go).
	retireSelect string

	// Failures: read and count a failed handling, of the record or of one
	// consumer's delivery.
	failureRecord   string
	failRecord      string
	abandonFailed   string
	failureDelivery string
	failDelivery    string
	abandonDelivery string

	requeueSelect     string
	requeueRecord     string
	requeueDeliveries string

	pendingAfter string
	claimStale   string
	// claimReplay is claimStale that also takes the records never sent
	// again after their publish (last_sent_at NULL), whatever their age.
	claimReplay string
	// claimSpaced is claimStale whose age grows with the record's wait
	// (ClaimSpaced).
	claimSpaced string
	// stamp is the prefix, ending in "id IN ", of a send time update.
	stamp string

	// cleanSelect picks a batch of completed records; cleanWhere is its
	// part after the table, for a partition's; cleanDeliveries and
	// cleanRecords are prefixes ending in "IN ".
	cleanSelect string
	// cleanOne is the dialect's cleaning of a batch in one statement
	// (Dialect.cleanSQL), "" without one.
	cleanOne        string
	cleanWhere      string
	cleanDeliveries string
	cleanRecords    string

	pendingStatus          string
	status                 string
	consumerPendingStatus  string
	consumerStatus         string
	listDeliveriesByRecord string // prefix ending in "record_id IN "
	// sawConsumer records a consumer seen, consumersSeen reads them all,
	// unchecked counts the pending records that wait for one never seen
	// (consumers_seen.go).
	sawConsumer   string
	consumersSeen string
	unchecked     string
	// declare begins the statement that records a start's declarations,
	// whose rows follow it, then declareUpsert; declaredConsumer reads
	// whether a topic's latest declaration lists a consumer, and when;
	// remoteConsumers reads the consumers declared remote
	// (declarations.go).
	declare          string
	declareUpsert    string
	declaredConsumer string
	remoteConsumers  string

	// list holds the statements of Operator.List; get reads one record,
	// with the columns scanInfos reads too.
	list listQueries
	get  string
	// makeDueSelect picks pending records to make due; makeDueStamp is
	// the prefix, ending in "id IN ", that sets their send time from its
	// first argument; requeueLater sets one record's.
	makeDueSelect string
	makeDueStamp  string
	requeueLater  string

	// dashboard holds the dashboard's other statements (dashboard.go,
	// activity.go).
	dashboard dashboardQueries

	versionQueries
}

// versionQueries are the statements on the schema version table, and the
// migration's own, of one table: a record table or an inbox.
type versionQueries struct {
	versionTableDDL       string
	versionIdentityColumn string
	addVersionIdentity    string
	migrationLock         string // "" when the database needs none
	schemaExists          string // "" when the database has no schemas
	readVersion           string
	readIdentity          string
	insertVersion         string
	updateVersion         string
	databaseName          string
}

// fragments are the pieces the statements are built from: the quoted
// tables, the dialect's clock and placeholders, and the conditions that say
// what is pending.
type fragments struct {
	d     *Dialect
	table tableName
	t, tc string // the quoted record and consumers tables
	ts    string // the quoted seen table
	td    string // the quoted declarations table
	clock string
	mark  bool
	// pending selects a pending record: neither completed (on a marking
	// table) nor abandoned; abandoning marks a record processed too.
	pending string
	// lazy is the dialect's lazy commit row source for the statements that
	// complete on their own, "" when they wait for the disk (the dialect
	// has none, or Config.DurableCompletion).
	lazy string
}

// A delivery row is pending while it is neither completed nor abandoned;
// cPending is the same condition on the consumers table aliased c.
const (
	deliveryPending = "processed_at IS NULL AND abandoned_at IS NULL"
	cPending        = "c.processed_at IS NULL AND c.abandoned_at IS NULL"
)

func (f fragments) p(n int) string { return f.d.placeholder(n) }

// message is true when the record's uuid column col is the delivered
// message's UUID, in placeholders n and n+1 (both bound to it, see
// uuidArgs), or when the delivery names no message (operators' tools).
// The record is found by its id first, so the comparison is a filter on
// the row, never an index choice.
func (f fragments) message(col string, n int) string {
	return fmt.Sprintf("(%s = '' OR %s = %s)", f.p(n), col, f.p(n+1))
}

// due is true when the row's retry delay in col is over.
func (f fragments) due(col string) string {
	return fmt.Sprintf("(%s IS NULL OR %s <= %s)", col, col, f.clock)
}

// wait is the microseconds until col, negated, when col is in the future;
// NULL when the row is due.
func (f fragments) wait(col string) string {
	return fmt.Sprintf("CASE WHEN %s > %s THEN 0 - %s END", col, f.clock, f.d.ageMicros(col))
}

// buildQueries builds every statement of a store once, when the store is
// made, so that its methods only execute them.
func buildQueries(d *Dialect, table tableName, mode Completion, durable bool) *queries {
	f := fragments{d: d, table: table, t: table.quoted(d), tc: table.in(d, consumersTable(table.name)),
		ts: table.in(d, seenTable(table.name)), td: table.in(d, declaredTable(table.name)),
		clock: d.clock, mark: mode == Mark, pending: "abandoned_at IS NULL"}
	if !durable {
		f.lazy = d.lazyCommit
	}
	if f.mark {
		f.pending = "processed_at IS NULL"
	}
	q := &queries{table: f.t, consumers: f.tc, mark: f.mark}
	q.buildInsert(f)
	q.buildCheck(f)
	q.buildComplete(f, mode)
	q.buildAdopt(f)
	q.buildRetire(f)
	q.buildFailure(f)
	q.buildResend(f)
	q.buildStatus(f)
	q.buildSeen(f)
	q.buildDeclarations(f)
	q.buildOperator(f)
	q.buildDashboard(f)
	q.buildSchema(f)
	return q
}

// buildFailure builds the statements of RecordFailure and of Requeue, which
// undoes an abandonment.
func (q *queries) buildFailure(f fragments) {
	t, tc, p, d, clock := f.t, f.tc, f.p, f.d, f.clock
	abandonSet := "abandoned_at = " + clock
	if f.mark {
		abandonSet += ", processed_at = " + clock
	}
	q.failureRecord = fmt.Sprintf("SELECT consumers, attempts FROM %s WHERE id = %s AND %s%s", t, p(1), f.pending, d.lockRows(false))
	q.failRecord = fmt.Sprintf("UPDATE %s SET attempts = %s, last_error = %s, due_at = %s WHERE id = %s", t, p(1), p(2), d.leaseUntil(3), p(4))
	q.abandonFailed = fmt.Sprintf("UPDATE %s SET attempts = %s, last_error = %s, %s WHERE id = %s", t, p(1), p(2), abandonSet, p(3))
	q.failureDelivery = fmt.Sprintf("SELECT attempts FROM %s WHERE record_id = %s AND consumer = %s AND %s%s", tc, p(1), p(2), deliveryPending, d.lockRows(false))
	q.failDelivery = fmt.Sprintf("UPDATE %s SET attempts = %s, last_error = %s, due_at = %s WHERE record_id = %s AND consumer = %s",
		tc, p(1), p(2), d.leaseUntil(3), p(4), p(5))
	q.abandonDelivery = fmt.Sprintf("UPDATE %s SET attempts = %s, last_error = %s, abandoned_at = %s WHERE record_id = %s AND consumer = %s",
		tc, p(1), p(2), clock, p(3), p(4))

	q.requeueSelect = fmt.Sprintf("SELECT id, topic, uuid, payload, metadata FROM %s WHERE id = %s AND abandoned_at IS NOT NULL%s", t, p(1), d.lockRows(false))
	revive := "abandoned_at = NULL, attempts = 0, due_at = NULL, lease_until = NULL, lease_owner = NULL"
	recordRevive := revive + ", last_sent_at = " + clock
	if f.mark {
		recordRevive += ", processed_at = NULL"
	}
	q.requeueRecord = fmt.Sprintf("UPDATE %s SET %s WHERE id = %s", t, recordRevive, p(1))
	q.requeueDeliveries = fmt.Sprintf("UPDATE %s SET %s WHERE record_id = %s AND abandoned_at IS NOT NULL", tc, revive, p(1))
}

// buildResend builds the statements that read records to send again
// (startup replay, stale resubmit) and stamp them sent, and those of the
// cleaning.
func (q *queries) buildResend(f fragments) {
	t, tc, p, d := f.t, f.tc, f.p, f.d
	q.pendingAfter = fmt.Sprintf("SELECT id, uuid, payload, metadata FROM %s%s WHERE topic = %s AND id > %s AND %s ORDER BY id LIMIT %s",
		t, d.forceIndex(f.table.name+"_pending"), p(1), p(2), f.pending, p(3))
	// A record with consumers is due when one of its pending deliveries
	// is.
	claim := func(sentBefore string, limit int) string {
		return fmt.Sprintf(`SELECT id, topic, uuid, payload, metadata FROM %s r
WHERE topic = %s AND id > %s AND %s AND %s
  AND ((consumers = 0 AND %s) OR (consumers > 0 AND EXISTS (SELECT 1 FROM %s c WHERE c.record_id = r.id AND %s AND %s)))
ORDER BY id LIMIT %s%s`,
			t, p(1), p(2), f.pending, sentBefore, f.due("due_at"), tc, cPending, f.due("c.due_at"), p(limit), d.lockRows(true))
	}
	q.claimStale = claim("COALESCE(last_sent_at, created_at) < "+d.ago(3)+" AND "+f.headOfKey(), 4)
	q.claimReplay = claim("(last_sent_at IS NULL OR last_sent_at < "+d.ago(3)+")", 4)
	// A record waits from its last send at least the minimum age (3) and
	// at most the maximum (4), and in between as long as it had waited
	// from its save to that send: twice its age at the last send, from
	// its save.
	lastSent := "COALESCE(last_sent_at, created_at)"
	q.claimSpaced = claim(fmt.Sprintf("%s < %s AND (%s < %s OR 2 * %s >= %s) AND %s",
		lastSent, d.ago(3), lastSent, d.ago(4), d.ageMicros(lastSent), d.ageMicros("created_at"), f.headOfKey()), 5)
	q.stamp = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id IN ", t, f.clock)

	q.cleanWhere = fmt.Sprintf(" WHERE processed_at < %s AND abandoned_at IS NULL ORDER BY processed_at LIMIT %s%s", d.ago(1), p(2), d.lockRows(true))
	q.cleanSelect = cleanSelectFrom(t) + q.cleanWhere
	q.cleanOne = d.cleanQuery(t, tc)
	q.cleanDeliveries = fmt.Sprintf("DELETE FROM %s WHERE record_id IN ", tc)
	q.cleanRecords = fmt.Sprintf("DELETE FROM %s WHERE id IN ", t)
}

// cleanSelectFrom begins the statement that selects old completed records
// of table, a quoted name: the record table or one of its partitions.
func cleanSelectFrom(table string) string { return "SELECT id, consumers FROM " + table }

// buildStatus builds the statements of PendingStatus and Status.
func (q *queries) buildStatus(f fragments) {
	t, tc, d, pending := f.t, f.tc, f.d, f.pending
	completed := "0"
	if f.mark {
		completed = "SUM(CASE WHEN processed_at IS NOT NULL AND abandoned_at IS NULL THEN 1 ELSE 0 END)"
	}
	q.pendingStatus = fmt.Sprintf("SELECT topic, COUNT(*), %s FROM %s WHERE %s GROUP BY topic ORDER BY topic",
		d.ageMicros("MIN(created_at)"), t, pending)
	q.status = fmt.Sprintf(`SELECT topic, SUM(CASE WHEN %s THEN 1 ELSE 0 END), %s,
SUM(CASE WHEN abandoned_at IS NOT NULL THEN 1 ELSE 0 END), %s
FROM %s GROUP BY topic ORDER BY topic`,
		pending, d.ageMicros("MIN(CASE WHEN "+pending+" THEN created_at END)"), completed, t)
	q.consumerPendingStatus = fmt.Sprintf(`SELECT r.topic, c.consumer, COUNT(*), %s
FROM %s c JOIN %s r ON r.id = c.record_id WHERE %s GROUP BY r.topic, c.consumer`,
		d.ageMicros("MIN(r.created_at)"), tc, t, cPending)
	q.consumerStatus = fmt.Sprintf(`SELECT r.topic, c.consumer, SUM(CASE WHEN %s THEN 1 ELSE 0 END), %s,
SUM(CASE WHEN c.abandoned_at IS NOT NULL THEN 1 ELSE 0 END), SUM(CASE WHEN c.processed_at IS NOT NULL THEN 1 ELSE 0 END)
FROM %s c JOIN %s r ON r.id = c.record_id GROUP BY r.topic, c.consumer`,
		cPending, d.ageMicros("MIN(CASE WHEN "+cPending+" THEN r.created_at END)"), tc, t)
}

// operatorColumns are the columns of a record that scanInfos reads.
func (f fragments) operatorColumns() string {
	state := "CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' ELSE 'pending' END"
	if f.mark {
		state = "CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' WHEN processed_at IS NOT NULL THEN 'completed' ELSE 'pending' END"
	}
	return fmt.Sprintf("id, topic, uuid, payload, metadata, %s, attempts, COALESCE(last_error, ''), %s, %s, %s",
		state, f.d.ageMicros("created_at"), f.d.ageMicros("COALESCE(last_sent_at, created_at)"), sendKind())
}

// listQueries are the statements of Operator.List, each a page of records
// in id order with the columns scanInfos reads.
type listQueries struct {
	// allTopics reads the records of a state across topics (no Completed
	// on a deleting table); byTopic one topic's, through the (topic, id)
	// index of the state; byConsumer a page of one consumer's pending
	// deliveries, through the consumers table's pending index;
	// abandonedOf the records, pending or abandoned, in which a consumer's
	// delivery was abandoned, by state.
	allTopics   map[State]string
	byTopic     map[State]string
	byConsumer  string
	abandonedOf map[State]string
}

// buildOperator builds the statements of the operator's methods: List,
// Get, MakeDue and RequeueLater.
func (q *queries) buildOperator(f fragments) {
	t, tc, p, d := f.t, f.tc, f.p, f.d
	columns := f.operatorColumns()
	conds := map[State]string{Pending: f.pending, Abandoned: "abandoned_at IS NOT NULL"}
	l := &q.list
	l.allTopics = make(map[State]string, len(conds)+1)
	l.byTopic = make(map[State]string, len(conds))
	l.abandonedOf = make(map[State]string, len(conds))
	for st, cond := range conds {
		l.allTopics[st] = fmt.Sprintf("SELECT %s FROM %s WHERE %s AND id > %s ORDER BY id LIMIT %s", columns, t, cond, p(1), p(2))
		l.byTopic[st] = fmt.Sprintf("SELECT %s FROM %s WHERE topic = %s AND %s AND id > %s ORDER BY id LIMIT %s",
			columns, t, p(1), cond, p(2), p(3))
		l.abandonedOf[st] = fmt.Sprintf(`SELECT %s FROM %s r WHERE topic = %s AND %s AND id > %s
  AND EXISTS (SELECT 1 FROM %s c WHERE c.record_id = r.id AND c.consumer = %s AND c.abandoned_at IS NOT NULL)
ORDER BY id LIMIT %s`, columns, t, p(1), cond, p(2), tc, p(3), p(4))
	}
	if f.mark {
		l.allTopics[Completed] = fmt.Sprintf("SELECT %s FROM %s WHERE processed_at IS NOT NULL AND abandoned_at IS NULL AND id > %s ORDER BY id LIMIT %s",
			columns, t, p(1), p(2))
	}
	// The page is a derived table rather than an IN (subquery), which
	// MySQL refuses with a LIMIT.
	l.byConsumer = fmt.Sprintf(`SELECT %s FROM %s JOIN (SELECT c.record_id AS page_id FROM %s c JOIN %s r ON r.id = c.record_id
  WHERE c.consumer = %s AND r.topic = %s AND c.record_id > %s AND %s ORDER BY c.record_id LIMIT %s) page ON id = page.page_id
ORDER BY id`, columns, t, tc, t, p(1), p(2), p(3), cPending, p(4))
	q.get = fmt.Sprintf("SELECT %s FROM %s WHERE id = %s", columns, t, p(1))
	q.listDeliveriesByRecord = fmt.Sprintf(`SELECT record_id, consumer,
    CASE WHEN abandoned_at IS NOT NULL THEN 'abandoned' WHEN processed_at IS NOT NULL THEN 'completed' ELSE 'pending' END,
    attempts, COALESCE(last_error, '')
FROM %s WHERE record_id IN `, tc)

	q.makeDueSelect = fmt.Sprintf("SELECT id FROM %s WHERE %s AND id > %s ORDER BY id LIMIT %s%s", t, f.pending, p(1), p(2), d.lockRows(true))
	q.makeDueStamp = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id IN ", t, p(1))
	q.requeueLater = fmt.Sprintf("UPDATE %s SET last_sent_at = %s WHERE id = %s", t, p(1), p(2))
}

// buildSchema builds the statements of Migrate and Verify on the schema
// version table, the one in the record table's schema.
func (q *queries) buildSchema(f fragments) { q.versionQueries = buildVersionQueries(f.d, f.table) }

// buildVersionQueries builds the statements on the schema version table of
// the table's schema.
func buildVersionQueries(d *Dialect, table tableName) versionQueries {
	p := d.placeholder
	vt := table.versionTable(d)
	return versionQueries{
		versionTableDDL:       d.versionTableDDL(vt),
		versionIdentityColumn: d.versionIdentityColumn(table),
		addVersionIdentity:    d.addVersionIdentity(vt),
		schemaExists:          d.schemaExists,
		migrationLock:         d.migrationLock,
		readVersion:           fmt.Sprintf("SELECT version, completion FROM %s WHERE table_name = %s", vt, p(1)),
		readIdentity:          fmt.Sprintf("SELECT table_identity FROM %s WHERE table_name = %s", vt, p(1)),
		insertVersion:         fmt.Sprintf("INSERT INTO %s (table_name, version, completion, table_identity) VALUES (%s, %s, %s, %s)", vt, p(1), p(2), p(3), p(4)),
		updateVersion:         fmt.Sprintf("UPDATE %s SET version = %s, table_identity = %s WHERE table_name = %s", vt, p(1), p(2), p(3)),
		databaseName:          d.databaseQuery,
	}
}

// micros is a duration as the integer argument of [Dialect.ago].
func micros(d time.Duration) int64 { return d.Microseconds() }
