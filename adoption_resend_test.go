package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// adoptedService is the service of Example_adoption, adopted by the
// README's adoptOutbox unchanged: its handlers report each order they
// receive.
type adoptedService struct {
	router   *message.Router
	orders   message.Publisher // the publisher adoptOutbox returned
	store    *sqlstore.Store   // the table adoptOutbox uses, as outboxctl opens it
	received map[string]chan string
}

// adopt builds the service on SQLite and GoChannel, with the stale
// resubmitter's defaults shortened, and the publisher the service had
// wrapped by wrap.
func adopt(t *testing.T, wrap func(message.Publisher) message.Publisher) *adoptedService {
	t.Helper()
	t.Cleanup(outbox.SetResubmitDefaults(50*time.Millisecond, 10*time.Millisecond))
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "service.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)

	logger := watermill.NewStdLogger(false, false)
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	t.Cleanup(func() { _ = pubSub.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	s := &adoptedService{router: router, received: map[string]chan string{}}
	for _, consumer := range []string{"ship", "stats"} {
		ch := make(chan string, 16)
		s.received[consumer] = ch
		router.AddNoPublisherHandler(consumer, "orders", pubSub, func(msg *message.Message) error {
			ch <- string(msg.Payload)
			return nil
		})
	}
	s.orders, err = adoptOutbox(context.Background(), db, router, wrap(pubSub), logger)
	require.NoError(t, err)
	s.store, err = sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), DB: sqlx.NewDb(db, "sqlite")})
	require.NoError(t, err)
	return s
}

// run runs the router until the test ends and returns once it is running.
func (s *adoptedService) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = s.router.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
	})
	<-s.router.Running()
}

// requireHandledByBoth waits until each handler received payload.
func (s *adoptedService) requireHandledByBoth(t *testing.T, payload string) {
	t.Helper()
	for consumer, ch := range s.received {
		select {
		case got := <-ch:
			require.Equal(t, payload, got, consumer)
		case <-time.After(10 * time.Second):
			t.Fatalf("handler %s never received %s while the service ran", consumer, payload)
		}
	}
}

// failFirst is a publisher whose first Publish fails without sending.
type failFirst struct {
	message.Publisher
	once sync.Once
}

func (p *failFirst) Publish(topic string, msgs ...*message.Message) error {
	failed := false
	p.once.Do(func() { failed = true })
	if failed {
		return errors.New("broker unreachable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// The README's adoption resends, while the service runs, a record whose
// publish saved it and then failed to send.
func TestAdoptionResendsALostSendWhileRunning(t *testing.T) {
	s := adopt(t, func(pub message.Publisher) message.Publisher { return &failFirst{Publisher: pub} })
	s.run(t)

	err := s.orders.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order-1")))
	require.Error(t, err, "the send failed after the record was saved")
	s.requireHandledByBoth(t, "order-1")
}

// The README's adoption resends, while the service runs, an abandoned
// record that outboxctl requeue made pending again.
func TestAdoptionResendsARequeuedRecordWhileRunning(t *testing.T) {
	s := adopt(t, func(pub message.Publisher) message.Publisher { return pub })
	ctx := context.Background()
	msg := message.NewMessage(watermill.NewUUID(), []byte("order-2"))
	require.NoError(t, s.orders.Publish("orders", msg)) // nobody subscribes yet: GoChannel drops it
	id, err := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataID), 10, 64)
	require.NoError(t, err)
	for _, consumer := range []string{"ship", "stats"} {
		_, abandoned, err := s.store.RecordFailure(ctx, recordstore.Delivery{ID: id, Topic: "orders", Consumer: consumer}, "failed for good", 1, nil)
		require.NoError(t, err)
		require.True(t, abandoned)
	}
	s.run(t) // the replay at start leaves the abandoned record alone

	require.NoError(t, s.store.Operator().RequeueLater(ctx, id), "what outboxctl requeue does")
	s.requireHandledByBoth(t, "order-2")
}
