package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestBackoffHoldIsNotAnError runs five poison messages with MaxAttempts 2
// through a router on GoChannel (which redelivers at once), with a
// capturing logger passed to the router: the copies that come back before
// their retry is due are held and nacked, which is routine, so the router
// logs no Error line for them; it logs the handler's failures and the
// abandonments only.
func TestBackoffHoldIsNotAnError(t *testing.T) {
	t.Parallel()
	const poison, maxAttempts = 5, 2
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{MaxAttempts: maxAttempts, Backoff: outbox.Backoff{Initial: 300 * time.Millisecond, Max: 300 * time.Millisecond}}, b.logger)
		require.NoError(t, err)
		runs := &runCounter{}
		boom := errors.New("poison")
		s := runService(t, b, []message.HandlerMiddleware{mw}, func(*message.Message) error { runs.add(); return boom })
		done := make(chan struct{}, poison)
		for range poison {
			go func() {
				publishUntilAcked(t, s.pub, b.topic, message.NewMessage(watermill.NewUUID(), nil), runs)
				done <- struct{}{}
			}()
		}
		for range poison {
			<-done
		}

		assert.Equal(t, poison*maxAttempts, runs.count())
		assert.Equal(t, recordstore.TopicStatus{Topic: b.topic, Abandoned: poison}, b.status(t))
		held := 0
		for _, e := range b.logger.Entries("debug") {
			if e.Msg == "Record not due for its next attempt, holding and nacking the copy" {
				held++
			}
		}
		lines := s.logger.Entries("error")
		t.Logf("%d handler runs, %d holds, %d router error lines", runs.count(), held, len(lines))
		require.Positive(t, held, "copies came back before their retry was due and were held")
		for _, e := range lines {
			assert.NotErrorIs(t, e.Err, recordstore.ErrNotDue, "a hold is not logged as an error: %s %v", e.Msg, e.Err)
		}
		assert.Len(t, lines, poison*maxAttempts, "the router logs each failed attempt (the last one abandons) and nothing else")
	})
}
