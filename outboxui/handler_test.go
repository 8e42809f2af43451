package outboxui_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	return testenv.Request(t, http.MethodGet, url, "", nil, nil)
}

// post sends an action's form as a browser of the same origin would not:
// without Origin or Sec-Fetch-Site headers, as a script would.
func post(t *testing.T, target string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	return testenv.Request(t, http.MethodPost, target, "", form, header)
}

var tokenField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token reads the action token from a record's page.
func token(t *testing.T, d *seeded, id int64) string {
	t.Helper()
	_, body := get(t, d.server.URL+"/outbox/record?id="+strconv.FormatInt(id, 10))
	m := tokenField.FindStringSubmatch(body)
	require.NotNil(t, m, "no token in the page:\n%s", body)
	return m[1]
}

func TestActionsAreRefusedWhenOff(t *testing.T) {
	t.Parallel()
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	_, page := get(t, d.server.URL+"/outbox/record?id="+strconv.FormatInt(d.abandoned, 10))
	assert.NotContains(t, page, `id="requeue"`, "no action button when actions are off")
	assert.NotContains(t, page, `name="csrf"`)
	for _, action := range []string{"requeue", "due", "retire"} {
		code, body := post(t, d.server.URL+"/outbox/"+action, url.Values{"id": {strconv.FormatInt(d.abandoned, 10)}, "topic": {"payments"}, "consumer": {"ship"}}, nil)
		assert.Equal(t, http.StatusForbidden, code, action)
		assert.Contains(t, body, "Actions are off", action)
	}
	assert.Equal(t, sqlstore.Abandoned, recordState(t, d, d.abandoned))
	assert.Len(t, d.logger.Entries("info"), 3, "each refusal is logged")
}

func TestActionsNeedTheTokenAndTheSameOrigin(t *testing.T) {
	t.Parallel()
	d := seed(t, backend(t, "SQLite"), outboxui.Config{Actions: true})
	id := strconv.FormatInt(d.abandoned, 10)
	target := d.server.URL + "/outbox/requeue"
	t.Run("NoToken", func(t *testing.T) {
		code, body := post(t, target, url.Values{"id": {id}}, nil)
		assert.Equal(t, http.StatusForbidden, code)
		assert.Contains(t, body, "reload the page")
	})
	t.Run("WrongToken", func(t *testing.T) {
		code, _ := post(t, target, url.Values{"id": {id}, "csrf": {strings.Repeat("0", 64)}}, nil)
		assert.Equal(t, http.StatusForbidden, code)
	})
	t.Run("OtherOrigin", func(t *testing.T) {
		code, body := post(t, target, url.Values{"id": {id}, "csrf": {token(t, d, d.abandoned)}},
			http.Header{"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}})
		assert.Equal(t, http.StatusForbidden, code)
		assert.Contains(t, body, "another site")
	})
	assert.Equal(t, sqlstore.Abandoned, recordState(t, d, d.abandoned), "nothing was requeued")
	t.Run("WithToken", func(t *testing.T) {
		code, _ := post(t, target, url.Values{"id": {id}, "csrf": {token(t, d, d.abandoned)}}, nil)
		assert.Equal(t, http.StatusSeeOther, code)
		assert.Equal(t, sqlstore.Pending, recordState(t, d, d.abandoned))
	})
}

func TestErrorsShowNoDetail(t *testing.T) {
	t.Parallel()
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	code, body := get(t, d.server.URL+"/outbox/record?id=999999")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "There is no record with this id.")
	code, _ = get(t, d.server.URL+"/outbox/records?state=completed&topic=orders")
	assert.Equal(t, http.StatusBadRequest, code)

	// A store whose table is gone: the page says so without naming it.
	s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: "no_such_table", DB: d.store.DB()})
	require.NoError(t, err)
	ui, err := outboxui.New(s, outboxui.Config{}, nil)
	require.NoError(t, err)
	srv := httptestServer(t, ui)
	code, body = get(t, srv+"/")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "The service&#39;s log has the detail.")
	assert.NotContains(t, body, "no_such_table")
}

func TestAuthorizeRefusesBeforeReading(t *testing.T) {
	t.Parallel()
	d := seed(t, backend(t, "SQLite"), outboxui.Config{Authorize: func(r *http.Request) error {
		if r.Header.Get("X-Operator") == "" {
			return errors.New("not an operator")
		}
		return nil
	}})
	code, body := get(t, d.server.URL+"/outbox/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.NotContains(t, body, "orders")
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	s, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: "t"})
	require.NoError(t, err)
	for _, cfg := range []outboxui.Config{{PageSize: 501}, {PageSize: -1}, {PayloadLimit: 8}, {Timeout: -1},
		{AllowedHosts: []string{""}}, {AllowedHosts: []string{"http://localhost:8080"}}, {AllowedHosts: []string{"localhost/outbox"}},
		{AllowedHosts: []string{"user@localhost"}}, {AllowedHosts: []string{"local host"}}, {AllowedHosts: []string{":8080"}}} {
		_, err := outboxui.New(s, cfg, nil)
		assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig, "%+v", cfg)
	}
	_, err = outboxui.New(nil, outboxui.Config{}, nil)
	assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
}

// retireForm is the form of a retire of consumer "stats" of "payments",
// confirmed or not.
func retireForm(t *testing.T, d *seeded, confirm bool) url.Values {
	form := url.Values{"topic": {"payments"}, "consumer": {"stats"}, "csrf": {token(t, d, d.shared)}}
	if confirm {
		form.Set("confirm", "yes")
	}
	return form
}

// statsPending is how many deliveries consumer "stats" of "payments" has
// pending.
func statsPending(t *testing.T, d *seeded) int64 {
	t.Helper()
	return testenv.ConsumerPending(t, d.store, "payments", "stats")
}

// TestRetireAsksBeforeItActs, on every database: an operator retires
// consumer "stats" of "payments" from the dashboard of a store that no
// start declared in. The first POST shows what the retire would complete
// and acts on nothing; the confirmed one completes and reports the count.
func TestRetireAsksBeforeItActs(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		d := seed(t, b, outboxui.Config{Actions: true})
		require.NoError(t, d.store.SawConsumer(testCtx(t), "payments", "stats"))
		target := d.server.URL + "/outbox/retire"

		code, body := post(t, target, retireForm(t, d, false), nil)
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, `<dd id="retire-pending">1</dd>`)
		assert.Regexp(t, `<dd id="retire-last-seen">\d+s ago</dd>`, body)
		assert.Contains(t, body, `name="confirm" value="yes"`)
		assert.Equal(t, int64(1), statsPending(t, d), "asking completes nothing")

		code, body = post(t, target, retireForm(t, d, true), nil)
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, `Completed <b id="retired-count">1</b> pending deliveries`)
		assert.Zero(t, statsPending(t, d))
	})
}

// TestRetireRefusesAConsumerTheLatestStartDeclares, on every database: the
// latest start of the service declared "stats" of "payments" (a remote
// consumer); the dashboard, which has no registry, says so when asked and
// when a confirmed form comes anyway, and completes nothing.
func TestRetireRefusesAConsumerTheLatestStartDeclares(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		d := seed(t, b, outboxui.Config{Actions: true})
		require.NoError(t, d.store.DeclareConsumers(testCtx(t), []recordstore.Declaration{{Topic: "payments", Consumers: []string{"ship"}, RemoteConsumers: []string{"stats"}}}))
		target := d.server.URL + "/outbox/retire"
		for _, confirm := range []bool{false, true} {
			code, body := post(t, target, retireForm(t, d, confirm), nil)
			assert.Equal(t, http.StatusConflict, code, "confirmed: %v", confirm)
			assert.Regexp(t, `The latest start of the service declared it, \d+s ago, as a remote consumer: it may still run`, body)
			assert.NotContains(t, body, `name="confirm"`)
		}
		assert.Equal(t, int64(1), statsPending(t, d), "nothing was completed")

		require.NoError(t, d.store.DeclareConsumers(testCtx(t), []recordstore.Declaration{{Topic: "payments", Consumers: []string{"ship"}}}))
		code, body := post(t, target, retireForm(t, d, true), nil)
		assert.Equal(t, http.StatusOK, code, body)
		assert.Zero(t, statsPending(t, d))
	})
}

// serveAllowing serves the dashboard of the seeded store under /outbox/,
// as a service mounts it, answering its own address (127.0.0.1:port) and
// the other hosts; it returns its URL and its own Host.
func serveAllowing(t *testing.T, d *seeded, others ...string) (string, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	own := ln.Addr().String()
	ui, err := outboxui.New(d.store, outboxui.Config{Actions: true, AllowedHosts: append([]string{own}, others...)}, d.logger)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, own
}

// TestAllowedHostsRefuseAForgedHostAndOrigin: a service mounts the
// dashboard with AllowedHosts; a page of another site, evil.example, whose
// name resolves to the service, sends its Host and Origin with every
// request.
func TestAllowedHostsRefuseAForgedHostAndOrigin(t *testing.T) {
	t.Parallel()
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	base, own := serveAllowing(t, d, "Outbox.Internal")
	_, port, err := net.SplitHostPort(own)
	require.NoError(t, err)
	evil := "evil.example:" + port
	sameSite := http.Header{"Origin": {"http://" + evil}, "Sec-Fetch-Site": {"same-origin"}}
	_, page := get(t, base+"/outbox/record?id="+strconv.FormatInt(d.shared, 10))
	m := tokenField.FindStringSubmatch(page)
	require.NotNil(t, m, page)
	tok := m[1]

	for _, path := range []string{"/outbox/", "/outbox/record?id=" + strconv.FormatInt(d.shared, 10), "/outbox/records?topic=orders", "/outbox/style.css"} {
		code, body := testenv.Request(t, http.MethodGet, base+path, evil, nil, nil)
		assert.Equal(t, http.StatusMisdirectedRequest, code, path)
		assert.NotContains(t, body, tok, path)
		assert.NotContains(t, body, "orders", path)
	}
	form := url.Values{"topic": {"payments"}, "consumer": {"stats"}, "csrf": {tok}, "confirm": {"yes"}}
	code, _ := testenv.Request(t, http.MethodPost, base+"/outbox/retire", evil, form, sameSite)
	assert.Equal(t, http.StatusMisdirectedRequest, code)
	// The Host of the service with a forged Origin: the browser said
	// same-origin, but the origin is not an allowed host.
	code, body := testenv.Request(t, http.MethodPost, base+"/outbox/retire", own, form, sameSite)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "another site")
	assert.Equal(t, int64(1), statsPending(t, d), "nothing was retired")
	assert.NotEmpty(t, d.logger.Entries("info"), "the refusals are logged")

	// Hosts are compared without regard to case; a name allowed without a
	// port is allowed only so.
	code, _ = testenv.Request(t, http.MethodGet, base+"/outbox/", "outbox.internal", nil, nil)
	assert.Equal(t, http.StatusOK, code)
	code, _ = testenv.Request(t, http.MethodGet, base+"/outbox/", "outbox.internal:"+port, nil, nil)
	assert.Equal(t, http.StatusMisdirectedRequest, code)

	code, _ = testenv.Request(t, http.MethodPost, base+"/outbox/retire", own, form, http.Header{"Origin": {"http://" + own}, "Sec-Fetch-Site": {"same-origin"}})
	assert.Equal(t, http.StatusOK, code, "the service's own page")
	assert.Zero(t, statsPending(t, d))

	// Guard gives the server's other handlers the same check.
	ui, err := outboxui.New(d.store, outboxui.Config{AllowedHosts: []string{own}}, nil)
	require.NoError(t, err)
	other := httptestServer(t, ui.Guard(http.RedirectHandler("/outbox/", http.StatusFound)))
	code, _ = testenv.Request(t, http.MethodGet, other+"/", evil, nil, nil)
	assert.Equal(t, http.StatusMisdirectedRequest, code)
	code, _ = testenv.Request(t, http.MethodGet, other+"/", own, nil, nil)
	assert.Equal(t, http.StatusFound, code)
}

// TestInboxPageNeedsAnInbox: a dashboard given no inbox links to none and
// answers its page with 404.
func TestInboxPageNeedsAnInbox(t *testing.T) {
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	_, overview := get(t, d.server.URL+"/outbox/")
	assert.NotContains(t, overview, `href="inbox"`)
	code, body := get(t, d.server.URL+"/outbox/inbox")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "not given the service")
}

// TestOverviewTellsWhenAConsumerOfOnlyAbandonedDeliveriesWasSeen: a
// consumer with nothing pending is not in the pending status, which tells
// when consumers were last seen; its row, listed for its abandoned
// delivery, still says when it was, and a consumer never seen says never.
func TestOverviewTellsWhenAConsumerOfOnlyAbandonedDeliveriesWasSeen(t *testing.T) {
	d := seed(t, backend(t, "SQLite"), outboxui.Config{})
	ctx := testCtx(t)
	require.NoError(t, d.store.Complete(ctx, recordstore.Delivery{ID: d.shared, Topic: "payments", Consumer: "ship"}))
	require.NoError(t, d.store.SawConsumer(ctx, "payments", "ship"))
	_, page := get(t, d.server.URL+"/outbox/")
	ship := regexp.MustCompile(`(?s)data-consumer="ship">.*?<td class="n pending">(\d+)</td>.*?<td class="last-seen">([^<]*)</td>`).FindStringSubmatch(page)
	require.NotNil(t, ship, page)
	assert.Equal(t, "0", ship[1], "ship has only its abandoned delivery")
	assert.Regexp(t, `^\d+s ago$`, ship[2])
	stats := regexp.MustCompile(`(?s)data-consumer="stats">.*?<td class="last-seen">([^<]*)</td>`).FindStringSubmatch(page)
	require.NotNil(t, stats, page)
	assert.Equal(t, "never", stats[1])
}
