package outboxui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// browser starts a headless Chromium (Debian's package) with a fresh
// profile and returns a tab's context. Without chromium the test skips,
// naming it, except in CI (CI=true), where it fails: .ci/run installs it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium is not installed (apt-get install -y chromium): %v", err)
		}
		t.Skipf("chromium is not installed (apt-get install -y chromium): %v", err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	)
	ctx, cancelTab := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// cell is the text of a cell of the overview's row.
func cell(row, class string) string { return row + " td." + class }

func topicRow(topic string) string { return fmt.Sprintf(`#topics tr.topic[data-topic=%q]`, topic) }

func consumerRow(topic, consumer string) string {
	return fmt.Sprintf(`#topics tr.consumer[data-topic=%q][data-consumer=%q]`, topic, consumer)
}

// texts reads the text of each selected element.
func texts(t *testing.T, ctx context.Context, sel ...string) []string {
	t.Helper()
	out := make([]string, len(sel))
	for i, q := range sel {
		var err error
		out[i], err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(q)))
		require.NoError(t, err, q)
	}
	return out
}

// visit loads a page and waits for an element of it.
func visit(t *testing.T, ctx context.Context, url, sel string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(sel))))
}

// click clicks an element and waits for an element of the page it leads
// to.
func click(t *testing.T, ctx context.Context, sel, then string) {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(step, chromedp.Click(chromedp.CSS(sel))); err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
	step2, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := chromedp.Do(step2, chromedp.WaitVisible(chromedp.CSS(then))); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("after click %s, wait %s: %v at %s\n%s", sel, then, err, loc, html)
	}
}

func eval(t *testing.T, ctx context.Context, js string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Evaluate[any](js))
	require.NoError(t, err)
}

// TestBrowserOverviewRecordRequeue loads the overview of a store with
// records in every state in Chromium, follows the abandoned record from
// the overview to its page, requeues it and checks the page's new state.
func TestBrowserOverviewRecordRequeue(t *testing.T) {
	for _, name := range []string{"SQLite", "Postgres"} {
		t.Run(name, func(t *testing.T) {
			d := seed(t, backend(t, name), outboxui.Config{Actions: true})
			ctx := browser(t)
			base := d.server.URL + "/outbox/"

			visit(t, ctx, base, "#topics")
			got := texts(t, ctx,
				cell(topicRow("orders"), "pending"), cell(topicRow("orders"), "abandoned"), cell(topicRow("orders"), "completed"),
				cell(topicRow("payments"), "pending"), cell(topicRow("payments"), "abandoned"),
				cell(consumerRow("payments", "ship"), "pending"), cell(consumerRow("payments", "ship"), "abandoned"),
				cell(consumerRow("payments", "stats"), "pending"), cell(consumerRow("payments", "stats"), "abandoned"),
			)
			assert.Equal(t, []string{"1", "1", "1", "1", "1", "1", "1", "1", "0"}, got)
			if path := os.Getenv("OUTBOXUI_SCREENSHOT"); path != "" && name == "Postgres" {
				png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(path, png, 0o644))
			}

			// Follow the abandoned record: the topic's abandoned list, then
			// the record's page.
			id := strconv.FormatInt(d.abandoned, 10)
			click(t, ctx, cell(topicRow("orders"), "abandoned")+" a", `#records tr[data-id="`+id+`"]`)
			click(t, ctx, `#records tr[data-id="`+id+`"] a`, "#state")
			got = texts(t, ctx, "#state", "#payload", "dd.err")
			assert.Equal(t, "abandoned", got[0])
			assert.Contains(t, got[1], "00 01 fe ff", "a binary payload is shown as hex")
			assert.Equal(t, "broker said no", got[2])

			// Without the token the browser's POST is refused.
			eval(t, ctx, `document.querySelector('input[name="csrf"]').remove()`)
			click(t, ctx, "#requeue", "#message")
			assert.Contains(t, texts(t, ctx, "#message")[0], "reload the page")
			assert.Equal(t, sqlstore.Abandoned, recordState(t, d, d.abandoned))

			// Requeue it: the page shows it pending.
			visit(t, ctx, base+"record?id="+id, "#requeue")
			click(t, ctx, "#requeue", "#notice")
			got = texts(t, ctx, "#notice", "#state")
			assert.Contains(t, got[0], "Requeued")
			assert.Equal(t, "pending", got[1])
			assert.Equal(t, sqlstore.Pending, recordState(t, d, d.abandoned))
			assert.NotEmpty(t, d.logger.Entries("info"), "the requeue is logged")

			// The overview counts it pending now.
			visit(t, ctx, base, "#topics")
			assert.Equal(t, []string{"2", "0"}, texts(t, ctx, cell(topicRow("orders"), "pending"), cell(topicRow("orders"), "abandoned")))
		})
	}
}

// TestBrowserActionsOff: with the actions off, a record's page has no
// action, and a form posted to an action anyway is refused.
func TestBrowserActionsOff(t *testing.T) {
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	ctx := browser(t)
	id := strconv.FormatInt(d.abandoned, 10)
	visit(t, ctx, d.server.URL+"/outbox/record?id="+id, "#state")
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[method="post"]').length`))
	require.NoError(t, err)
	// A form made by hand, as a curious operator might.
	eval(t, ctx, `(() => { const f = document.createElement('form'); f.method = 'post'; f.action = 'requeue';
		const i = document.createElement('input'); i.name = 'id'; i.value = '`+id+`'; f.appendChild(i);
		document.body.appendChild(f); f.submit(); })()`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#message"))))
	message := texts(t, ctx, "#message")[0]
	assert.Zero(t, buttons)
	assert.Contains(t, message, "did not turn its actions on")
	assert.Equal(t, sqlstore.Abandoned, recordState(t, d, d.abandoned))
}

func recordState(t *testing.T, d *seeded, id int64) sqlstore.State {
	t.Helper()
	r, err := d.store.Operator().Get(testCtx(t), id)
	require.NoError(t, err)
	return r.State
}

// TestBrowserRetireAsksFirst, in Chromium, on every database: the latest
// start of the service declared "stats" of "payments" a remote consumer
// (in another service, confirming over the broker). The overview shows its
// delivery awaiting confirmation, and its retire button leads to a
// refusal; once a start no longer declares it, to the question with what
// the retire would complete and when it was last seen, and then to the
// count it completed.
func TestBrowserRetireAsksFirst(t *testing.T) {
	for _, b := range testenv.Backends() { // one Chromium at a time
		t.Run(b.Name, func(t *testing.T) { browserRetireAsksFirst(t, b) })
	}
}

func browserRetireAsksFirst(t *testing.T, b testenv.Backend) {
	d := seed(t, b, outboxui.Config{Actions: true})
	ctx := browser(t)
	base := d.server.URL + "/outbox/"
	declare := func(decl recordstore.Declaration) {
		t.Helper()
		require.NoError(t, d.store.DeclareConsumers(testCtx(t), []recordstore.Declaration{decl}))
	}
	declare(recordstore.Declaration{Topic: "payments", Consumers: []string{"ship"}, RemoteConsumers: []string{"stats"}})
	require.NoError(t, d.store.SawConsumer(testCtx(t), "payments", "stats"))
	stats := consumerRow("payments", "stats")

	visit(t, ctx, base, "#topics")
	assert.Equal(t, []string{"remote", "1", "1"}, texts(t, ctx, stats+" span.remote", cell(stats, "pending"), cell(stats, "awaiting")))
	click(t, ctx, stats+" button", "#refused")
	assert.Regexp(t, `declared it, \d+s ago, as a remote consumer`, texts(t, ctx, "#refused")[0])
	assert.Equal(t, int64(1), statsPending(t, d))

	declare(recordstore.Declaration{Topic: "payments", Consumers: []string{"ship"}})
	visit(t, ctx, base, "#topics")
	click(t, ctx, stats+" button", "#retire-question")
	got := texts(t, ctx, "#retire-pending", "#retire-last-seen", "#retire-confirm")
	assert.Equal(t, "1", got[0])
	assert.Regexp(t, `^\d+s ago$`, got[1])
	assert.Equal(t, "complete 1 deliveries", got[2])
	assert.Equal(t, int64(1), statsPending(t, d), "asking completes nothing")

	click(t, ctx, "#retire-confirm", "#retired")
	assert.Equal(t, "1", texts(t, ctx, "#retired-count")[0])
	assert.Zero(t, statsPending(t, d))
}

// TestBrowserOverviewLabelsTheHoursCompletions, in Chromium: the
// overview's rates sit under "completed in the last hour" and say what
// they count; a topic none of whose records completed in the hour (all of
// its records failed) shows none completed, not a failure rate; an
// abandoned record's page shows no next attempt, and an abandoned
// delivery none either.
func TestBrowserOverviewLabelsTheHoursCompletions(t *testing.T) {
	for _, b := range testenv.Backends() { // one Chromium at a time
		t.Run(b.Name, func(t *testing.T) {
			d := seed(t, b, outboxui.Config{})
			ctx := browser(t)
			base := d.server.URL + "/outbox/"

			visit(t, ctx, base, "#topics")
			assert.Equal(t, []string{"completed in the last hour", "records", "resent", "failed at least once"},
				texts(t, ctx, "#h-completed", "#h-completed-count", "#h-resent", "#h-failed"))
			head := texts(t, ctx, "#topics thead")[0]
			assert.NotContains(t, head, "1h", "the columns say what they count")
			orders, payments := topicRow("orders"), topicRow("payments")
			assert.Equal(t, []string{"1", "0.0%", "0.0%"}, texts(t, ctx, cell(orders, "completed"), cell(orders, "resent"), cell(orders, "failed")))
			assert.Equal(t, []string{"0", "–", "–", "1"},
				texts(t, ctx, cell(payments, "completed"), cell(payments, "resent"), cell(payments, "failed"), cell(payments, "abandoned")),
				"payments completed nothing in the hour: its only finished record was abandoned")
			title, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(cell(payments, "failed")), "title"))
			require.NoError(t, err)
			assert.Equal(t, "no record completed in the last hour", title.Value)

			visit(t, ctx, base+"record?id="+strconv.FormatInt(d.abandoned, 10), "#state")
			page := texts(t, ctx, "main")[0]
			assert.Equal(t, "abandoned", texts(t, ctx, "#state")[0])
			assert.NotContains(t, page, "next attempt", "an abandoned record has none")
			assert.NotContains(t, page, "due")

			visit(t, ctx, base+"record?id="+strconv.FormatInt(d.sharedAbandoned, 10), "#deliveries")
			assert.Equal(t, []string{"abandoned", "–"}, texts(t, ctx, `#deliveries tr[data-consumer="ship"] td.state`, `#deliveries tr[data-consumer="ship"] td:last-child`))

			visit(t, ctx, base+"record?id="+strconv.FormatInt(d.pending, 10), "#state")
			assert.Equal(t, "due", texts(t, ctx, "#next-attempt")[0], "a pending record that never failed is due now")
		})
	}
}

// TestBrowserOverviewShowsWhyABacklogIsStuck, in Chromium, on every
// database: "payments" declares "ship" and a remote consumer "stats", and
// only "ship" was ever seen; no receiver of "orders" was. The overview
// shows, per topic and consumer, the records that wait for a receiver
// never seen (unchecked), when each was last seen, and the deliveries
// that await a remote consumer's confirmation with the oldest's age. Once
// the receivers are seen, nothing is unchecked, and the remote consumer's
// delivery still awaits its confirmation.
func TestBrowserOverviewShowsWhyABacklogIsStuck(t *testing.T) {
	for _, b := range testenv.Backends() { // one Chromium at a time
		t.Run(b.Name, func(t *testing.T) { browserOverviewShowsWhyABacklogIsStuck(t, b) })
	}
}

func browserOverviewShowsWhyABacklogIsStuck(t *testing.T, b testenv.Backend) {
	d := seed(t, b, outboxui.Config{})
	ctx := browser(t)
	base := d.server.URL + "/outbox/"
	require.NoError(t, d.store.DeclareConsumers(testCtx(t), []recordstore.Declaration{{Topic: "payments", Consumers: []string{"ship"}, RemoteConsumers: []string{"stats"}}}))
	require.NoError(t, d.store.SawConsumer(testCtx(t), "payments", "ship"))
	orders, payments := topicRow("orders"), topicRow("payments")
	ship, stats := consumerRow("payments", "ship"), consumerRow("payments", "stats")
	seconds, ago := `^\d+s$`, `^\d+s ago$`

	visit(t, ctx, base, "#topics")
	assert.Equal(t, []string{"unchecked", "last seen", "awaiting confirmation", "deliveries", "oldest"},
		texts(t, ctx, "#h-unchecked", "#h-last-seen", "#h-awaiting", "#h-awaiting-count", "#h-awaiting-oldest"))
	assert.Equal(t, []string{"1", "never", "–"}, texts(t, ctx, cell(orders, "unchecked"), cell(orders, "last-seen"), cell(orders, "awaiting")),
		"no receiver of orders was ever seen: its pending record waits for one")
	got := texts(t, ctx, cell(stats, "unchecked"), cell(stats, "last-seen"), cell(stats, "awaiting"), cell(stats, "awaiting-oldest"))
	assert.Equal(t, []string{"1", "never", "1"}, got[:3], "stats never confirmed: its delivery is unchecked and awaits its confirmation")
	assert.Regexp(t, seconds, got[3])
	got = texts(t, ctx, cell(ship, "unchecked"), cell(ship, "last-seen"), cell(ship, "awaiting"))
	assert.Equal(t, []string{"0", "–"}, []string{got[0], got[2]}, "ship is of this service: it confirms nothing")
	assert.Regexp(t, ago, got[1])
	got = texts(t, ctx, cell(payments, "unchecked"), cell(payments, "last-seen"), cell(payments, "awaiting"), cell(payments, "awaiting-oldest"))
	assert.Equal(t, []string{"1", "1"}, []string{got[0], got[2]})
	assert.Regexp(t, ago, got[1])
	assert.Regexp(t, seconds, got[3])

	require.NoError(t, d.store.SawConsumer(testCtx(t), "orders", ""))
	require.NoError(t, d.store.SawConsumer(testCtx(t), "payments", "stats"))
	visit(t, ctx, base, "#topics")
	got = texts(t, ctx, cell(orders, "unchecked"), cell(orders, "last-seen"), cell(stats, "unchecked"), cell(stats, "last-seen"), cell(stats, "awaiting"), cell(payments, "unchecked"))
	assert.Equal(t, []string{"0", "0", "1", "0"}, []string{got[0], got[2], got[4], got[5]}, "seen, nothing is unchecked; stats' delivery still awaits its confirmation")
	assert.Regexp(t, ago, got[1])
	assert.Regexp(t, ago, got[3])
}

// TestBrowserInboxShowsEachSendersIdentity, in Chromium, on every
// database: the inbox page, linked from every page's header, lists the
// latest entries of the service's inbox, the most recent first, each with
// its consumer, the sender's identity (Source), its record there, the
// message UUID and when it was handled.
func TestBrowserInboxShowsEachSendersIdentity(t *testing.T) {
	for _, b := range testenv.Backends() { // one Chromium at a time
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			table := testenv.Table(t)
			in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: b.Dialect, DB: db, Table: table})
			require.NoError(t, err)
			t.Cleanup(func() { testenv.DropTable(t, db, b.Dialect, table) })
			require.NoError(t, in.Migrate(testCtx(t)))
			older := recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m-older", BusinessKey: "order-7", Source: "orders-service-eu", RecordID: 17}
			latest := recordstore.InboxEntry{Consumer: "shipping", MessageUUID: "m-latest", Source: "payments-service", RecordID: 42}
			require.NoError(t, in.MarkHandled(testCtx(t), older))
			_, err = db.ExecContext(testCtx(t), db.Rebind("UPDATE "+in.Table()+" SET handled_at = ? WHERE message_uuid = ?"), "2020-01-01 00:00:00", older.MessageUUID)
			require.NoError(t, err)
			require.NoError(t, in.MarkHandled(testCtx(t), latest))

			d := seed(t, b, outboxui.Config{Inbox: in})
			ctx := browser(t)
			visit(t, ctx, d.server.URL+"/outbox/", "#topics")
			click(t, ctx, "#nav-inbox", "#inbox")
			row := func(e recordstore.InboxEntry) []string {
				r := fmt.Sprintf(`#inbox tr[data-uuid=%q]`, e.MessageUUID)
				return texts(t, ctx, r+" td.consumer", r+" td.source", r+" td.record-id", r+" td.uuid", r+" td.business-key")
			}
			assert.Equal(t, []string{"shipping", "payments-service", "42", "m-latest", "–"}, row(latest))
			assert.Equal(t, []string{"billing", "orders-service-eu", "17", "m-older", "order-7"}, row(older))
			uuids, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#inbox tbody tr')].map(r => r.dataset.uuid)`))
			require.NoError(t, err)
			assert.Equal(t, []string{"m-latest", "m-older"}, uuids, "the most recent first")
			handled := texts(t, ctx, `#inbox tr[data-uuid="m-latest"] td.handled`, `#inbox tr[data-uuid="m-older"] td.handled`)
			assert.Regexp(t, `^\d+s ago$`, handled[0])
			assert.Regexp(t, `^\d+d\d\dh ago$`, handled[1])
		})
	}
}
