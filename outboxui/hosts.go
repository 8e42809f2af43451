package outboxui

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/sqlstore"
)

// hosts is the set of Config.AllowedHosts, lower case; nil when none are
// set.
type hosts map[string]bool

// parseHosts checks and collects the allowed hosts: each a Host value as a
// browser sends it, a name or an address with an optional port, nothing
// else.
func parseHosts(list []string) (hosts, error) {
	if len(list) == 0 {
		return nil, nil
	}
	out := make(hosts, len(list))
	for _, h := range list {
		u, err := url.Parse("http://" + h)
		if h == "" || err != nil || u.Host != h || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Hostname() == "" {
			return nil, fmt.Errorf("%w: outboxui: AllowedHosts entry %q is not a host with an optional port, such as localhost:8080", sqlstore.ErrInvalidConfig, h)
		}
		out[strings.ToLower(h)] = true
	}
	return out, nil
}

// allows reports whether a Host value, or the host of an Origin, is one of
// the allowed hosts; every one is when none are set.
func (hs hosts) allows(host string) bool { return hs == nil || hs[strings.ToLower(host)] }

// sameOrigin reports whether an action's Origin, when it has one, is an
// allowed host. Without AllowedHosts the cross-origin protection compares
// it with the request's Host, which the page that sent it chose.
func (hs hosts) sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if hs == nil || origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && hs.allows(u.Host)
}

// Guard returns next answering only the requests whose Host is one of
// [Config.AllowedHosts], as the dashboard does; the others get 421
// Misdirected Request. It is for the other handlers of a server that serves
// the dashboard (a redirect to it, the server's whole mux); without
// AllowedHosts it returns next.
func (h *Handler) Guard(next http.Handler) http.Handler {
	if h.hosts == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.misdirected(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// misdirected answers, and logs, a request whose Host is not allowed: it
// names a site that is not this server's, as a page of another site whose
// name resolves to this server sends.
func (h *Handler) misdirected(w http.ResponseWriter, r *http.Request) bool {
	if h.hosts.allows(r.Host) {
		return false
	}
	h.logger.Info("outboxui: request refused: Host is not allowed", watermill.LogFields{"path": r.URL.Path, "remote": r.RemoteAddr, "host": r.Host})
	http.Error(w, "misdirected request: this server does not answer for this host", http.StatusMisdirectedRequest)
	return true
}
