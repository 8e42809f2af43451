package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
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
