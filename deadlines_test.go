package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/outboxops"
)

// TestSilentDatabaseDeadlines puts the service's store behind a fault proxy
// that keeps every connection to PostgreSQL (and MariaDB) open and answers
// nothing, after the service has read its table identity: each call that
// reads or writes the table returns an error once its deadline has passed
// instead of hanging. Replay, the router's start with ReplayPlugin, the
// stale resubmitter's round and the cleaner are given a short
// StatementTimeout; Publish with a plain message context and ReadStatus on
// a plain context are bounded by DefaultStatementTimeout (30 s).
func TestSilentDatabaseDeadlines(t *testing.T) {
	t.Parallel()
	const short = 300 * time.Millisecond
	calls := []struct {
		name string
		// wait is how long the call may take, after its deadline.
		wait time.Duration
		call func(ctx context.Context, b *bundle) error
	}{
		{name: "Publish", wait: outbox.DefaultStatementTimeout, call: func(_ context.Context, b *bundle) error {
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			pub, err := outbox.NewPublisher(b.reg, gc)
			if err != nil {
				return err
			}
			err = pub.Publish(b.topic, message.NewMessage(watermill.NewUUID(), nil))
			var insErr *outbox.InsertError
			if !errors.As(err, &insErr) {
				return errors.New("not an InsertError: " + errText(err))
			}
			return err
		}},
		{name: "ReadStatus", wait: outbox.DefaultStatementTimeout, call: func(ctx context.Context, b *bundle) error {
			_, err := outboxops.ReadStatus(ctx, b.reg, outboxops.StatusOptions{Full: true})
			return err
		}},
		{name: "Replay", wait: short, call: func(ctx context.Context, b *bundle) error {
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			_, err := outbox.Replay(ctx, b.reg, gc, outbox.ReplayConfig{StatementTimeout: short}, nil)
			return replayOrVerifyError(err)
		}},
		{name: "RouterRunWithReplayPlugin", wait: short, call: func(ctx context.Context, b *bundle) error {
			gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			defer gc.Close()
			router, err := message.NewRouter(message.RouterConfig{}, nil)
			if err != nil {
				return err
			}
			router.AddPlugin(outbox.ReplayPlugin(b.reg, gc, outbox.ReplayConfig{StatementTimeout: short}, nil))
			router.AddNoPublisherHandler("consume", b.topic, gc, func(*message.Message) error { return nil })
			return replayOrVerifyError(router.Run(ctx))
		}},
		{name: "StaleResubmitRound", wait: short, call: func(ctx context.Context, b *bundle) error {
			r, err := outbox.NewStaleResubmitter(b.reg, discardPublisher{}, outbox.StaleResubmitterConfig{OlderThan: time.Millisecond, StatementTimeout: short}, nil)
			if err != nil {
				return err
			}
			_, err = r.ResubmitOnce(ctx)
			return err
		}},
		{name: "CleanOnce", wait: short, call: func(ctx context.Context, b *bundle) error {
			c, err := outboxops.NewCleaner(b.reg, outboxops.CleanerConfig{OlderThan: time.Millisecond, StatementTimeout: short}, nil)
			if err != nil {
				return err
			}
			_, err = c.CleanOnce(ctx)
			return err
		}},
	}
	for _, backend := range testenv.Backends() {
		if backend.Name == "SQLite" {
			continue // a file, no connection to silence
		}
		t.Run(backend.Name, func(t *testing.T) {
			t.Parallel()
			// The calls run at once, each on a silenced store of its own,
			// so that the two bounded by DefaultStatementTimeout wait
			// their 30 s together, in one of the suite's parallel slots.
			var wg sync.WaitGroup
			for _, c := range calls {
				b, proxy, _ := proxiedBundle(t, backend, 3)
				proxy.Silence()
				wg.Go(func() {
					defer proxy.Restore()
					done := make(chan error, 1)
					go func() { done <- c.call(context.Background(), b) }()
					select {
					case err := <-done:
						if err == nil {
							t.Errorf("%s: a database that never answers is not an error", c.name)
							return
						}
						t.Logf("%s returned: %v", c.name, err)
						assert.True(t, isDeadline(err), "%s: a deadline error: %v", c.name, err)
					case <-time.After(c.wait + guard):
						t.Errorf("%s still waits for a silent database after %v", c.name, c.wait+guard)
					}
				})
			}
			wg.Wait()
		})
	}
}

func replayOrVerifyError(err error) error {
	var replayErr *outbox.ResendError
	var verifyErr *outbox.VerifyError
	if err != nil && !errors.As(err, &replayErr) && !errors.As(err, &verifyErr) {
		return errors.New("neither a ResendError nor a VerifyError: " + err.Error())
	}
	return err
}

// isDeadline tells a deadline error, whichever way the driver reports it.
func isDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || strings.Contains(errText(err), "deadline exceeded") || strings.Contains(errText(err), "timeout")
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
