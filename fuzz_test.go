package outbox_test

import (
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// FuzzMiddlewareMetadata feeds arbitrary outbox metadata (id, name and
// table identity) and message UUIDs to the middleware on a real SQLite
// store that tracks two topics, each holding one pending record saved for
// the message "fuzz". Outside a router the topic is the
// message's name. Whatever the input, the outcome is one of the documented
// ones, never a panic, and never the completion of another topic's record:
//
//   - no id: the handler runs;
//   - a name not tracked here, or another table's identity: the handler
//     runs untracked and no record changes;
//   - a malformed id: the handler runs once, untracked, and no record changes;
//   - the pending record of the name, with the record's message UUID: the
//     handler runs and that record completes;
//   - the pending record of the name with any other UUID, "" too (a forged
//     message): ack, handler not run, and the record stays pending;
//   - any other id (the other topic's record, or none): ack, handler not run.
func FuzzMiddlewareMetadata(f *testing.F) {
	backend := testenv.Backends()[1]
	b := &bundle{backend: backend, db: backend.Open(f), logger: &testenv.CaptureLogger{}}
	b.store = testenv.NewStore(f, backend, b.db, sqlstore.Mark)
	b.topic = "orders"
	const other = "refunds"
	var err error
	if b.reg, err = outbox.NewRegistry(outbox.Tracked{Topic: b.topic, Store: b.store}, outbox.Tracked{Topic: other, Store: b.store}); err != nil {
		f.Fatal(err)
	}
	own, err := b.store.Identity(f.Context())
	if err != nil {
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
		{"2", "refunds"}, {"3", "refunds"},
	} {
		for _, identity := range []string{"", own, "0123456789abcdef0123456789abcdef", "' OR 1=1 --"} {
			f.Add(seed.id, seed.name, identity, true, recordUUID, false)
		}
		f.Add(seed.id, seed.name, own, false, recordUUID, false)
	}
	for _, uuid := range []string{recordUUID, "", "forged", "FUZZ", "fuzz ", "%", "' OR 1=1 --"} {
		for _, name := range []string{b.topic, other} {
			f.Add("", name, own, true, uuid, true)
		}
	}

	// spellPending replaces the fuzzed id with the id of the topic's pending
	// record, so that the seeds reach it whatever ids the store gave.
	f.Fuzz(func(t *testing.T, id, name, identity string, withID bool, uuid string, spellPending bool) {
		// One fresh pending record per topic and input, so the "pending"
		// branch is reachable whenever the input spells its id.
		recs := []recordstore.Record{{Topic: b.topic, UUID: recordUUID}, {Topic: other, UUID: recordUUID}}
		for i := range recs {
			if err := b.store.Insert(t.Context(), recs[i:i+1]); err != nil {
				t.Fatal(err)
			}
		}
		ids := map[string]int64{b.topic: recs[0].ID, other: recs[1].ID}
		if rid, tracked := ids[name]; spellPending && tracked {
			id = strconv.FormatInt(rid, 10)
		}
		// Only this input's records may be pending while it runs.
		defer func() {
			for topic, rid := range ids {
				_ = b.store.Complete(t.Context(), recordstore.Delivery{ID: rid, Topic: topic})
			}
		}()

		msg := message.NewMessage(uuid, nil)
		if withID {
			msg.Metadata.Set(outbox.MetadataID, id)
		}
		msg.Metadata.Set(outbox.MetadataTopic, name)
		msg.Metadata.Set(outbox.MetadataTable, identity)
		ran := false
		_, err := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(msg)
		if werr := outbox.WaitBackgroundCompletions(t.Context(), b.reg); werr != nil {
			t.Fatal(werr)
		}
		if err != nil {
			t.Fatalf("id %q name %q identity %q: a message with outbox metadata is never nacked without a database failure: %v", id, name, identity, err)
		}
		pending := func(topic string) bool {
			return b.store.CheckPending(t.Context(), recordstore.Delivery{ID: ids[topic], Topic: topic}) == nil
		}
		completedOwn := false
		switch _, tracked := ids[name]; {
		case !withID || !tracked || identity != own:
			if !ran {
				t.Fatalf("id %q name %q identity %q: not this service's, the handler must run", id, name, identity)
			}
		case !canonicalID(id):
			if !ran {
				t.Fatalf("malformed id %q: the handler must run once, untracked", id)
			}
		case id == strconv.FormatInt(ids[name], 10) && uuid != recordUUID:
			if ran {
				t.Fatalf("message %q naming record %s of %q, saved for %q, ran the handler", uuid, id, name, recordUUID)
			}
		case id == strconv.FormatInt(ids[name], 10):
			if !ran {
				t.Fatalf("pending record %s of %q: the handler must run", id, name)
			}
			if pending(name) {
				t.Fatalf("record %s of %q not completed", id, name)
			}
			completedOwn = true
		default:
			if ran {
				t.Fatalf("id %q of no pending record of %q ran the handler", id, name)
			}
		}
		for topic := range ids {
			if (topic != name || !completedOwn) && !pending(topic) {
				t.Fatalf("id %q name %q identity %q uuid %q completed the record of %q", id, name, identity, uuid, topic)
			}
		}
	})
}

// recordUUID is the message UUID the fuzzed records are saved with.
const recordUUID = "fuzz"

func canonicalID(id string) bool {
	n, err := strconv.ParseInt(id, 10, 64)
	return err == nil && n > 0 && strconv.FormatInt(n, 10) == id
}
