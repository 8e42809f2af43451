package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
)

// TestCommands runs every command on every database.
func TestCommands(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)

		r := f.ctl(t, "status")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `^TOPIC\s+PENDING\s+OLDEST PENDING\s+ABANDONED\s+COMPLETED\s+UNCHECKED\s+HELD KEYS\s+LAST SEEN\n`, r.stdout)
		assert.Regexp(t, `\norders\s+2\s+\S+\s+1\s+1\s+2\s+0\s+never\n$`, r.stdout, "no receiver of orders was ever seen")

		r = f.ctl(t, "-json", "status")
		require.Zero(t, r.code, r.stderr)
		var status statusJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &status), r.stdout)
		assert.Equal(t, "mark", status.Completion)
		assert.Equal(t, f.store.Table(), status.Table)
		require.Len(t, status.Topics, 1)
		assert.Equal(t, recordstore.TopicStatus{Topic: "orders", Pending: 2, OldestPending: status.Topics[0].OldestPending, Abandoned: 1, Completed: 1, Unchecked: 2}, status.Topics[0])
		assert.Contains(t, r.stdout, `"last_seen_seconds_ago": null`)

		assert.Contains(t, r.stdout, `"topics": [`)
		assert.NotContains(t, r.stdout, `"name"`)
		require.NoError(t, f.store.SawConsumer(t.Context(), "orders", "handler"))
		r = f.ctl(t, "status")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `\norders\s+2\s+\S+\s+1\s+1\s+0\s+0\s+\S+ ago\n$`, r.stdout, "its receiver was seen")

		r = f.ctl(t, "list", "-state", "abandoned")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `^ID\s+TOPIC\s+UUID\s+STATE\s+ATTEMPTS\s+AGE\s+RESENT\s+CONSUMERS\s+LAST ERROR\n`, r.stdout)
		assert.Regexp(t, `\n`+f.id(1)+`\s+orders\s+uuid-1\s+abandoned\s+1\s+\S+\s+never\s+-\s+payment service said no\n$`, r.stdout)
		assert.Empty(t, r.stderr, "no more records")
		assert.NotContains(t, r.stdout, " \n", "no spaces at the ends of lines")

		r = f.ctl(t, "show", f.id(1))
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `^id:         `+f.id(1)+`
topic:      orders
uuid:       uuid-1
state:      abandoned
attempts:   1
age:        \S+
last sent:  \S+ ago, by the publish that saved it
last error: payment service said no
metadata:   \{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"\}
payload:    \{"n":1\}
$`, r.stdout)

		r = f.ctl(t, "-json", "show", f.id(1))
		require.Zero(t, r.code, r.stderr)
		var shown recordJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), r.stdout)
		assert.Equal(t, "orders", shown.Topic)
		assert.Equal(t, "abandoned", shown.State)
		assert.Equal(t, `{"n":1}`, shown.Payload)
		assert.Equal(t, map[string]string(f.recs[1].Metadata), shown.Metadata)
		assert.False(t, shown.Due)
		assert.False(t, shown.Resent)
		require.NotNil(t, shown.LastSentSecsAgo)

		r = f.ctl(t, "due", "-dry-run")
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "2 pending record(s) would be made due (dry run, nothing changed)\n", r.stdout)
		assert.Empty(t, r.stderr, "no progress when stderr is not a terminal")
		claimed, err := f.store.ClaimStale(t.Context(), "orders", 0, time.Hour, 10)
		require.NoError(t, err)
		assert.Empty(t, claimed, "a dry run changes nothing")

		r = f.ctl(t, "due", "-batch", "1")
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "2 pending record(s) made due for the service's stale resubmitter\n", r.stdout)

		r = f.ctl(t, "list")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `\n`+f.id(2)+`\s+orders\s+uuid-2\s+pending\s+0\s+\S+\s+due now\s`, r.stdout, "not an age of decades")
		assert.NotContains(t, r.stdout, "h0m")
		r = f.ctl(t, "-json", "show", f.id(2))
		require.Zero(t, r.code, r.stderr)
		assert.Contains(t, r.stdout, `"due": true`)
		assert.NotContains(t, r.stdout, "last_sent_seconds_ago")
		r = f.ctl(t, "show", f.id(2))
		assert.Contains(t, r.stdout, "last sent:  due now (made due by outboxctl due or requeue)\n")

		claimed, err = f.store.ClaimStale(t.Context(), "orders", 0, time.Hour, 10)
		require.NoError(t, err)
		assert.Len(t, claimed, 2, "the service's resubmitter sends them at its next round")
		r = f.ctl(t, "list", "-json")
		require.Zero(t, r.code, r.stderr)
		var page listJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &page), r.stdout)
		require.Len(t, page.Records, 2)
		assert.True(t, page.Records[0].Resent)
		assert.False(t, page.Records[0].Due)
		require.NotNil(t, page.Records[0].LastSentSecsAgo)
		assert.Less(t, *page.Records[0].LastSentSecsAgo, 3600.0)
		r = f.ctl(t, "list")
		assert.Regexp(t, `\n`+f.id(2)+`\s+orders\s+uuid-2\s+pending\s+0\s+\S+\s+\S+ ago\s`, r.stdout)

		r = f.ctl(t, "requeue", f.id(1))
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "1 abandoned record(s) pending again, due for the service's stale resubmitter\n", r.stdout)
		require.NoError(t, f.store.CheckPending(t.Context(), delivery(f.recs[1].ID)))
		r = f.ctl(t, "show", f.id(1))
		assert.Contains(t, r.stdout, "state:      pending\nattempts:   0\n")
		assert.Contains(t, r.stdout, "last sent:  due now")
		r = f.ctl(t, "requeue", f.id(1))
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stderr, "not abandoned")

		r = f.ctl(t, "clean", "-older-than", "1h")
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "0 completed record(s) deleted\n", r.stdout)
		_, err = f.store.DB().ExecContext(t.Context(), "UPDATE "+f.store.Table()+" SET processed_at = '2000-01-01 00:00:00' WHERE processed_at IS NOT NULL")
		require.NoError(t, err)
		r = f.ctl(t, "-json", "clean", "-older-than", "1h")
		require.Zero(t, r.code, r.stderr)
		assert.JSONEq(t, `{"deleted": 1}`, r.stdout)
	})
}

// TestGlobalFlagsAnywhere gives the global flags after the command, among
// its arguments, as people type them.
func TestGlobalFlagsAnywhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Backends()[1])
	for _, args := range [][]string{
		{"-dsn", f.dsn, "-table", f.store.Table(), "-json", "show", f.id(1)},
		{"show", f.id(1), "-json", "-dsn", f.dsn, "-table", f.store.Table()},
		{"-dsn", f.dsn, "show", "-json", f.id(1), "-table", f.store.Table()},
		{"-table", f.store.Table(), "show", "-dsn=" + f.dsn, "-json", "--", f.id(1)},
	} {
		r := outboxctl(t, "", nil, args...)
		require.Zero(t, r.code, "%v: %s", args, r.stderr)
		var shown recordJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), "%v: %s", args, r.stdout)
		assert.Equal(t, f.recs[1].ID, shown.ID, "%v", args)
		assert.Equal(t, "abandoned", shown.State, "%v", args)
	}

	r := outboxctl(t, "", nil, "list", "-state", "abandoned", "-dsn", f.dsn, "-limit", "5", "-table", f.store.Table())
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "uuid-1")

	r = outboxctl(t, "", []string{"OUTBOX_DSN=" + f.dsn}, "status", "-table", f.store.Table())
	require.Zero(t, r.code, "the DSN comes from OUTBOX_DSN: %s", r.stderr)
	r = outboxctl(t, "", []string{"OUTBOX_DSN=elsewhere.db"}, "status", "-table", f.store.Table(), "-dsn", f.dsn)
	require.Zero(t, r.code, "-dsn wins over OUTBOX_DSN: %s", r.stderr)
}

// TestListSaysThereAreMore pages through the pending records one at a
// time.
func TestListSaysThereAreMore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Backends()[1])

	r := f.ctl(t, "list", "-limit", "1")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "uuid-2")
	assert.NotContains(t, r.stdout, "uuid-3")
	assert.Equal(t, "… more: use -after "+f.id(2)+"\n", r.stderr)

	r = f.ctl(t, "-json", "list", "-limit", "1")
	require.Zero(t, r.code, r.stderr)
	var page listJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page), r.stdout)
	assert.True(t, page.More)
	assert.Equal(t, f.recs[2].ID, page.NextAfter)
	require.Len(t, page.Records, 1)

	r = f.ctl(t, "list", "-limit", "1", "-after", f.id(2))
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "uuid-3")
	assert.Empty(t, r.stderr, "the last page")
	r = f.ctl(t, "-json", "list", "-limit", "1", "-after", f.id(2))
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"more": false`)
	assert.NotContains(t, r.stdout, "next_after")
}

// payments saves n records of "payments" with the consumers "email" and
// "stats".
func (f *fixture) payments(t *testing.T, n int) []recordstore.Record {
	t.Helper()
	recs := make([]recordstore.Record, n)
	for i := range recs {
		recs[i] = recordstore.Record{Topic: "payments", UUID: fmt.Sprintf("payment-%d", i), Consumers: []string{"email", "stats"}}
	}
	require.NoError(t, f.store.Insert(t.Context(), recs))
	return recs
}

// TestRetire retires a consumer no longer declared on every database: its
// pending deliveries are completed, and the records no other consumer
// waits for with them.
func TestRetire(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)
		recs := f.payments(t, 3)
		for _, r := range recs[:2] {
			require.NoError(t, f.store.Complete(t.Context(), recordstore.Delivery{ID: r.ID, Topic: "payments", Consumer: "email"}))
		}

		r := f.ctl(t, "retire", "-topic", "payments", "-consumer", "stats")
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "3 pending deliveries of consumer \"stats\" to topic \"payments\" completed\n", r.stdout)
		pending, err := f.store.PendingAfter(t.Context(), "payments", 0, 10)
		require.NoError(t, err)
		require.Len(t, pending, 1, "email has still to complete one")
		assert.Equal(t, recs[2].ID, pending[0].ID)

		r = f.ctl(t, "-json", "retire", "-topic", "payments", "-consumer", "stats")
		require.Zero(t, r.code, r.stderr)
		assert.JSONEq(t, `{"topic": "payments", "consumer": "stats", "completed": 0}`, r.stdout)

		r = f.ctl(t, "status")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `\norders\s+2\s+\S+\s+1\s+1\s`, r.stdout, "another topic is not touched")
		assert.Regexp(t, `\npayments\s+1\s+\S+\s+0\s+2\s`, r.stdout)
	})
}

// TestRetireRefusesAConsumerTheLatestStartDeclares, on every database: a
// service shares the table with another whose consumer "stats" is down,
// with 3 deliveries pending; the latest start of the service declared
// "email" and "stats". outboxctl retire refuses "stats", exiting 1, until a
// start declares "email" alone.
func TestRetireRefusesAConsumerTheLatestStartDeclares(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)
		f.payments(t, 3)
		declare := func(consumers ...string) {
			t.Helper()
			require.NoError(t, f.store.DeclareConsumers(t.Context(), []recordstore.Declaration{{Topic: "payments", Consumers: consumers}}))
		}
		declare("email", "stats")

		r := f.ctl(t, "retire", "-topic", "payments", "-consumer", "stats")
		assert.Equal(t, exitFail, r.code)
		assert.Regexp(t, `^outboxctl: outbox: consumer "stats" of topic "payments" is declared by the latest start of its service, \S+ ago: .*remove it from Tracked.Consumers and restart the service first\n$`, r.stderr)
		assert.Empty(t, r.stdout)
		pending, err := f.store.PendingAfter(t.Context(), "payments", 0, 10)
		require.NoError(t, err)
		assert.Len(t, pending, 3, "nothing was completed")

		declare("email")
		r = f.ctl(t, "retire", "-topic", "payments", "-consumer", "stats")
		require.Zero(t, r.code, r.stderr)
		assert.Equal(t, "3 pending deliveries of consumer \"stats\" to topic \"payments\" completed\n", r.stdout)
	})
}

// TestStatusShowsTheDeliveriesAwaitingConfirmation, on every database: a
// topic with a local consumer and a remote one (a service with a database
// of its own, which confirms over the broker), as the latest start
// declared them.
func TestStatusShowsTheDeliveriesAwaitingConfirmation(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)
		recs := []recordstore.Record{
			{Topic: "payments", UUID: "payment-1", Consumers: []string{"email", "billing"}},
			{Topic: "payments", UUID: "payment-2", Consumers: []string{"email", "billing"}},
		}
		require.NoError(t, f.store.Insert(t.Context(), recs))
		require.NoError(t, f.store.Complete(t.Context(), recordstore.Delivery{ID: recs[0].ID, Topic: "payments", Consumer: "email"}))
		r := f.ctl(t, "status")
		require.Zero(t, r.code, r.stderr)
		assert.NotContains(t, r.stdout, "REMOTE CONSUMER", "no start declared a remote consumer")

		require.NoError(t, f.store.DeclareConsumers(t.Context(), []recordstore.Declaration{{Topic: "payments", Consumers: []string{"email"}, RemoteConsumers: []string{"billing"}}}))
		r = f.ctl(t, "status")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `\n\nREMOTE CONSUMER\s+TOPIC\s+AWAITING CONFIRMATION\s+OLDEST\s+LAST SEEN\nbilling\s+payments\s+2\s+\S+\s+never\n$`, r.stdout)

		r = f.ctl(t, "-json", "status")
		require.Zero(t, r.code, r.stderr)
		var status statusJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &status), r.stdout)
		require.Len(t, status.Topics, 2)
		payments := status.Topics[1]
		require.Equal(t, "payments", payments.Topic)
		require.Len(t, payments.Consumers, 2)
		assert.Equal(t, "billing", payments.Consumers[0].Consumer)
		assert.True(t, payments.Consumers[0].Remote)
		assert.Equal(t, int64(2), payments.Consumers[0].Pending)
		assert.Positive(t, payments.Consumers[0].OldestPending)
		assert.False(t, payments.Consumers[1].Remote)
	})
}

// TestListAndRequeueOfRecordsWithConsumers: list shows the attempts and
// last error of a record's deliveries, and requeue of an id the table does
// not hold says "not found", as show does.
func TestListAndRequeueOfRecordsWithConsumers(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		f := newFixture(t, b)
		recs := []recordstore.Record{{Topic: "payments", UUID: "payment-1", Consumers: []string{"email", "stats"}}}
		require.NoError(t, f.store.Insert(t.Context(), recs))
		d := recordstore.Delivery{ID: recs[0].ID, Topic: "payments", Consumer: "stats"}
		for range 2 {
			_, _, err := f.store.RecordFailure(t.Context(), d, "stats service down", 2, nil)
			require.NoError(t, err)
		}
		require.NoError(t, f.store.Complete(t.Context(), recordstore.Delivery{ID: recs[0].ID, Topic: "payments", Consumer: "email"}))

		r := f.ctl(t, "list", "-state", "abandoned")
		require.Zero(t, r.code, r.stderr)
		assert.Regexp(t, `\n`+strconv.FormatInt(recs[0].ID, 10)+`\s+payments\s+payment-1\s+abandoned\s+2\s.*stats service down`, r.stdout)

		r = f.ctl(t, "requeue", "999999")
		assert.NotZero(t, r.code)
		assert.Contains(t, r.stderr, "record not found")
		r = f.ctl(t, "show", "999999")
		assert.NotZero(t, r.code)
		assert.Contains(t, r.stderr, "record not found")
	})
}

// TestProgressLine: what a long operation draws on a terminal.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "[###############...............] 50/100 25/s", progressLine(50, 100, 2*time.Second))
	assert.Equal(t, "1200 600/s", progressLine(1200, 0, 2*time.Second))
	assert.False(t, isTerminal(&strings.Builder{}))
}
