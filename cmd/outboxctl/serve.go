package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/outboxui"
	"github.com/wmoutbox/outbox/sqlstore"
)

// serve serves the dashboard under /outbox/ until ctx ends (the
// interrupt).
func (c *cli) serve(ctx context.Context, s *sqlstore.Store) error {
	logger := watermill.NewStdLoggerWithOut(c.errOut, false, false)
	ui, err := outboxui.New(s, outboxui.Config{Actions: c.actions}, logger)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
	mux.Handle("/{$}", http.RedirectHandler("/outbox/", http.StatusFound))
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
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
