package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// TestRemoteCase runs the remote case alone at its smallest size: both
// rows on each broker, with their per-side columns. An ordered row whose
// keys ran out of order at B fails the run.
func TestRemoteCase(t *testing.T) {
	testenv.Postgres(t) // skips, or fails under CI=true, when PostgreSQL is not reachable
	t.Setenv(outbox.EnvToggle, "on")
	var out bytes.Buffer
	o := options{dbs: []string{"postgres"}, cases: map[string]bool{"remote": true}, saturatedN: 100, saturatedRounds: 1, stall: defaultStall,
		dsn: dsns{postgres: testenv.PostgresDSN()}, amqpURI: amqpURI(), duration: 50 * time.Millisecond, rounds: 1}
	if err := run(context.Background(), &out, o); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{"A commits/msg", "B statements/msg", "held/msg", "resent/msg",
		"remote, 100 messages, 10 keys in turn, 50 per Publish, GoChannel (reorders) | unordered", "GoChannel (reorders) | ordered (OrderKey)",
		"remote on GoChannel (reorders): ordered / unordered"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	if !strings.Contains(text, "RabbitMQ, one queue, one consumer (keeps order) | ordered (OrderKey)") && !strings.Contains(text, "RabbitMQ is not reachable") {
		t.Errorf("the report has neither RabbitMQ's rows nor why not")
	}
	if strings.Contains(text, "never delivered") {
		t.Errorf("a remote case lost messages")
	}
	if t.Failed() || testing.Verbose() {
		t.Log(text)
	}
}
