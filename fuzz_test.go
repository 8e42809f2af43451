package outbox_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// FuzzMiddlewareMetadata feeds arbitrary outbox metadata to the middleware on
// a real SQLite store holding one pending record. Whatever the input, the
// outcome is one of the documented ones and never a panic:
//
//   - no id: the handler runs;
//   - an unknown name: the handler runs untracked;
//   - a malformed id: ErrInvalidMetadata, handler not run;
//   - an id with no pending record: ack, handler not run;
//   - the pending record's id: the handler runs and the record completes.
func FuzzMiddlewareMetadata(f *testing.F) {
	backend := testenv.Backends()[1]
	b := &bundle{backend: backend, db: backend.Open(f), logger: &testenv.CaptureLogger{}}
	b.store = testenv.NewStore(f, backend, b.db, sqlstore.Mark)
	b.topic = "orders"
	var err error
	if b.reg, err = outbox.NewRegistry(outbox.Tracked{Name: b.topic, Store: b.store}); err != nil {
		f.Fatal(err)
	}
	mw, err := outbox.NewMiddleware(b.reg, outbox.MiddlewareConfig{}, nil)
	if err != nil {
		f.Fatal(err)
	}

	for _, seed := range []struct{ id, name string }{
		{"", ""}, {"", "orders"}, {"1", "orders"}, {"-1", "orders"}, {"0", "orders"},
		{"abc", "orders"}, {"99999999999999999999999", "orders"}, {"9223372036854775807", "orders"},
		{"1 OR 1=1", "orders"}, {"1; DROP TABLE x; --", "orders"}, {"０１", "orders"}, {"\x00", "orders"},
		{"1", "unknown"}, {"1", "orders' OR '1'='1"}, {"2", ""}, {" 1", "orders"}, {"1e3", "orders"}, {"0x10", "orders"},
	} {
		f.Add(seed.id, seed.name, true)
		f.Add(seed.id, seed.name, false)
	}

	f.Fuzz(func(t *testing.T, id, name string, withID bool) {
		// One fresh pending record per input, so the "pending" branch is
		// reachable whenever the input spells its id.
		rec := []outbox.Record{{Topic: b.topic, UUID: "fuzz"}}
		if err := b.store.Insert(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		pendingID := strconv.FormatInt(rec[0].ID, 10)
		// Only this input's record may be pending while it runs.
		defer func() { _ = b.store.Complete(t.Context(), b.delivery(rec[0].ID)) }()

		msg := message.NewMessage("fuzz", nil)
		if withID {
			msg.Metadata.Set(outbox.MetadataID, id)
		}
		msg.Metadata.Set(outbox.MetadataName, name)
		ran := false
		_, err := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(msg)

		switch {
		case !withID:
			if err != nil || !ran {
				t.Fatalf("no id: err %v ran %v", err, ran)
			}
		case name != b.topic:
			if err != nil || !ran {
				t.Fatalf("unknown name %q: err %v ran %v", name, err, ran)
			}
		case id == pendingID:
			if err != nil || !ran {
				t.Fatalf("pending record %s: err %v ran %v", id, err, ran)
			}
			if err := b.store.CheckPending(t.Context(), b.delivery(rec[0].ID)); !errors.Is(err, outbox.ErrNotPending) {
				t.Fatalf("record %s not completed: %v", id, err)
			}
		case err != nil:
			if !errors.Is(err, outbox.ErrInvalidMetadata) || ran {
				t.Fatalf("id %q: err %v ran %v", id, err, ran)
			}
			if n, perr := strconv.ParseInt(id, 10, 64); perr == nil && n > 0 && strconv.FormatInt(n, 10) == id {
				t.Fatalf("canonical id %q refused: %v", id, err)
			}
		default:
			if ran {
				t.Fatalf("id %q of no pending record ran the handler", id)
			}
		}
	})
}
