package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/sqlstore"
)

// serve serves the dashboard under /outbox/ until ctx ends (the
// interrupt), to the Host values of servedHosts alone.
func (c *cli) serve(ctx context.Context, s *sqlstore.Store) error {
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer ln.Close()
	logger := watermill.NewStdLoggerWithOut(c.errOut, false, false)
	cfg := outboxui.Config{Actions: c.actions, AllowedHosts: servedHosts(c.addr, ln.Addr(), c.allowHosts)}
	if c.inbox != "" {
		if cfg.Inbox, err = c.openInbox(ctx, s); err != nil {
			return err
		}
	}
	ui, err := outboxui.New(s, cfg, logger)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
	mux.Handle("/{$}", http.RedirectHandler("/outbox/", http.StatusFound))
	srv := &http.Server{Handler: ui.Guard(mux), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.errOut, "outboxctl: dashboard on http://%s/outbox/\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("serve: stopping: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// openInbox opens the -inbox table on the store's database and reads it
// once, so that a mistyped name fails before the dashboard serves.
func (c *cli) openInbox(ctx context.Context, s *sqlstore.Store) (*sqlstore.Inbox, error) {
	in, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: s.Dialect(), DB: s.DB(), Table: c.inbox})
	if errors.Is(err, sqlstore.ErrInvalidTable) {
		return nil, usagef("-inbox: %v", err)
	}
	if err != nil {
		return nil, err
	}
	readCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if _, err := in.Recent(readCtx, 1); err != nil {
		return nil, fmt.Errorf("serve: -inbox %q: %w", c.inbox, err)
	}
	return in, nil
}

// servedHosts are the Host values serve answers: the listen address as
// given and as bound, the loopback names, each with the bound port, and
// the names of -allow-host, with the port or, when they have none, both
// without it (behind a proxy on the default port) and with the bound one.
func servedHosts(addr string, bound net.Addr, extra []string) []string {
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return []string{bound.String()}
	}
	out := []string{bound.String()}
	withPort := func(host string) { out = append(out, net.JoinHostPort(host, port)) }
	for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
		withPort(host)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		withPort(host)
	}
	for _, name := range extra {
		if _, _, err := net.SplitHostPort(name); err == nil {
			out = append(out, name)
			continue
		}
		out = append(out, name)
		withPort(strings.Trim(name, "[]"))
	}
	return out
}
