package testenv

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Request sends a request to target, a form when form is not nil, with the
// Host given ("" for target's own) and the headers, without following a
// redirect, and returns the status and the body. A Host other than
// target's is what a page of another site whose name resolves to the
// server sends (DNS rebinding).
func Request(tb testing.TB, method, target, host string, form url.Values, header http.Header) (int, string) {
	tb.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	require.NoError(tb, err)
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, string(b)
}
