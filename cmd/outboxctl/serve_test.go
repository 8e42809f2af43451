package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestServe serves the dashboard of a table, loads its overview and stops
// on the interrupt.
func TestServe(t *testing.T) {
	t.Parallel()
	b := testenv.Backends()[1] // SQLite: the command works the same for any DSN
	require.Equal(t, "SQLite", b.Name)
	f := newFixture(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errR, errW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		defer errW.Close()
		code <- run(ctx, []string{"-dsn", f.dsn, "-table", f.store.Table(), "serve", "-addr", "127.0.0.1:0"}, io.Discard, errW, func(string) string { return "" })
	}()
	lines := bufio.NewScanner(errR)
	require.True(t, lines.Scan(), "serve printed nothing")
	m := regexp.MustCompile(`dashboard on (http://\S+/outbox/)$`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, errR) }()

	resp, err := http.Get(m[1])
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `data-topic="orders"`)
	assert.Contains(t, string(body), "read only", "actions are off without -actions")

	cancel()
	assert.Equal(t, exitOK, <-code)
}

// startServe runs outboxctl serve with args on the fixture's table until
// the test ends, and returns the dashboard's URL.
func startServe(t *testing.T, f *fixture, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errR, errW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		defer errW.Close()
		code <- run(ctx, append([]string{"-dsn", f.dsn, "-table", f.store.Table(), "serve", "-addr", "127.0.0.1:0"}, args...), io.Discard, errW, func(string) string { return "" })
	}()
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, exitOK, <-code)
	})
	lines := bufio.NewScanner(errR)
	require.True(t, lines.Scan(), "serve printed nothing")
	m := regexp.MustCompile(`dashboard on (http://\S+/outbox/)$`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, errR) }()
	return m[1]
}

// TestServeAnswersOnlyItsHosts: outboxctl serve -actions on the loopback,
// with -allow-host outbox.test; a page of evil.example, whose name its
// owner resolves to 127.0.0.1, reads and posts with its own Host and
// Origin. A consumer "stats" of "payments", of a service that shares the
// table, has 2 deliveries pending.
func TestServeAnswersOnlyItsHosts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Backends()[1])
	f.payments(t, 2)
	base := startServe(t, f, "-actions", "-allow-host", "outbox.test")
	u, err := url.Parse(base)
	require.NoError(t, err)
	port := u.Port()
	evil := "evil.example:" + port
	pending := func() int64 { return testenv.ConsumerPending(t, f.store, "payments", "stats") }

	_, page := testenv.Request(t, http.MethodGet, base, u.Host, nil, nil)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	require.NotNil(t, m, page)
	token := m[1]
	for _, target := range []string{base, base + "record?id=" + f.id(2), base + "style.css", "http://" + u.Host + "/"} {
		code, body := testenv.Request(t, http.MethodGet, target, evil, nil, nil)
		assert.Equal(t, http.StatusMisdirectedRequest, code, target)
		assert.NotContains(t, body, token, target)
		assert.NotContains(t, body, "orders", target)
	}
	form := url.Values{"csrf": {token}, "topic": {"payments"}, "consumer": {"stats"}, "confirm": {"yes"}}
	code, _ := testenv.Request(t, http.MethodPost, base+"retire", evil, form, http.Header{"Origin": {"http://" + evil}, "Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusMisdirectedRequest, code, "the forged Host")
	code, _ = testenv.Request(t, http.MethodPost, base+"retire", u.Host, form, http.Header{"Origin": {"http://" + evil}, "Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusForbidden, code, "the forged Origin, with a Host of the server")
	assert.Equal(t, int64(2), pending(), "nothing was retired")

	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "outbox.test", "outbox.test:" + port, "OUTBOX.test"} {
		code, _ := testenv.Request(t, http.MethodGet, base, host, nil, nil)
		assert.Equal(t, http.StatusOK, code, host)
	}
	code, body := testenv.Request(t, http.MethodPost, base+"retire", "localhost:"+port, form, http.Header{"Origin": {"http://localhost:" + port}, "Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<b id="retired-count">2</b>`)
	assert.Zero(t, pending())
}

// TestServeShowsTheInbox: outboxctl serve -inbox on a service's SQLite
// database whose inbox kept an entry of another service's message: the
// inbox page names the sender. A mistyped -inbox fails before serving.
func TestServeShowsTheInbox(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Backends()[1])
	in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: f.store.Dialect(), DB: f.store.DB(), Table: f.store.Table() + "_inbox"})
	require.NoError(t, err)
	require.NoError(t, in.Migrate(context.Background()))
	require.NoError(t, in.MarkHandled(context.Background(), recordstore.InboxEntry{Consumer: "billing", MessageUUID: "m-1", Source: "orders-service", RecordID: 7}))

	base := startServe(t, f, "-inbox", in.Table())
	u, err := url.Parse(base)
	require.NoError(t, err)
	code, body := testenv.Request(t, http.MethodGet, base+"inbox", u.Host, nil, nil)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "orders-service")
	assert.Contains(t, body, "m-1")

	var errOut strings.Builder
	exit := run(context.Background(), []string{"-dsn", f.dsn, "-table", f.store.Table(), "serve", "-addr", "127.0.0.1:0", "-inbox", "no_such_inbox"}, io.Discard, &errOut, func(string) string { return "" })
	assert.NotEqual(t, exitOK, exit)
	assert.Contains(t, errOut.String(), "no_such_inbox")
}
