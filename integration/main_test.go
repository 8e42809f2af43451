package integration_test

import (
	"os"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
)

func TestMain(m *testing.M) {
	// The scenarios exercise the real path, which a test binary turns off
	// by default.
	os.Setenv(outbox.EnvToggle, "on")
	os.Exit(m.Run())
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// records returns the record database of that name from testenv.Backends.
func records(t *testing.T, name string) testenv.Backend {
	for _, b := range testenv.Backends() {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no record backend %q", name)
	return testenv.Backend{}
}

// connected returns what a Connect opened, closed when the test ends. The
// router closes its subscribers itself, concurrently with its own return, so
// the subscriber's Close is made safe to call twice at once.
func connected(t *testing.T, pub message.Publisher, sub message.Subscriber) (message.Publisher, message.Subscriber) {
	s := &closeOnceSubscriber{Subscriber: sub}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{s, pub} {
			if err := c.Close(); err != nil {
				t.Logf("close: %v", err)
			}
		}
	})
	return pub, s
}

type closeOnceSubscriber struct {
	message.Subscriber
	mu     sync.Mutex
	closed bool
}

func (s *closeOnceSubscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.Subscriber.Close()
}
