package outboxtest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/wmoutbox/outbox/recordstore"
)

// RequirePublished fails the test unless records were saved for the topic
// that satisfy every matcher ([WithPayload], [WithMetadata]), and returns
// those, in id order, whatever became of them since: the messages the code
// under test published through the outbox. Without matchers it returns
// every record of the topic.
func RequirePublished(tb testing.TB, store *Store, topic string, matchers ...Matcher) []recordstore.Record {
	tb.Helper()
	infos := store.Records(topic)
	if len(infos) == 0 {
		tb.Fatalf("outboxtest: no record was saved for topic %q%s", topic, savedElsewhere(store))
	}
	var out []recordstore.Record
	for _, info := range infos {
		if matchAll(info.Record, matchers) {
			out = append(out, info.Record)
		}
	}
	if len(out) == 0 {
		wants := make([]string, len(matchers))
		for i, m := range matchers {
			wants[i] = m.desc
		}
		tb.Fatalf("outboxtest: none of the %d record(s) of topic %q has %s:\n%s", len(infos), topic, strings.Join(wants, " and "), describe(infos))
	}
	return out
}

// Matcher is a condition on a saved record, for [RequirePublished].
type Matcher struct {
	desc    string
	matches func(recordstore.Record) bool
}

// WithPayload matches the records whose payload is payload.
func WithPayload(payload []byte) Matcher {
	return Matcher{desc: fmt.Sprintf("payload %q", payload), matches: func(r recordstore.Record) bool {
		return bytes.Equal(r.Payload, payload)
	}}
}

// WithMetadata matches the records whose message metadata has key set to
// value.
func WithMetadata(key, value string) Matcher {
	return Matcher{desc: fmt.Sprintf("metadata %s=%q", key, value), matches: func(r recordstore.Record) bool {
		v, ok := r.Metadata[key]
		return ok && v == value
	}}
}

func matchAll(r recordstore.Record, matchers []Matcher) bool {
	for _, m := range matchers {
		if !m.matches(r) {
			return false
		}
	}
	return true
}

// RequireNotPublished fails the test if a record was saved for the topic.
func RequireNotPublished(tb testing.TB, store *Store, topic string) {
	tb.Helper()
	if infos := store.Records(topic); len(infos) > 0 {
		tb.Fatalf("outboxtest: %d record(s) were saved for topic %q, want none:\n%s", len(infos), topic, describe(infos))
	}
}

// RequirePending fails the test unless exactly n records of the topic are
// pending (n may be 0), and returns them in id order.
func RequirePending(tb testing.TB, store *Store, topic string, n int) []recordstore.Record {
	tb.Helper()
	infos := store.Records(topic)
	var pending []recordstore.Record
	for _, info := range infos {
		if info.State == Pending {
			pending = append(pending, info.Record)
		}
	}
	if len(pending) != n {
		tb.Fatalf("outboxtest: %d record(s) of topic %q are pending, want %d:\n%s", len(pending), topic, n, describe(infos))
	}
	return pending
}

// RequireCompleted fails the test unless the record with the id was
// completed (by every consumer it declared), and returns it.
func RequireCompleted(tb testing.TB, store *Store, id int64) recordstore.RecordInfo {
	tb.Helper()
	return requireState(tb, store, id, Completed)
}

// RequireAbandoned fails the test unless the record with the id was
// abandoned after its last allowed attempt, and returns it.
func RequireAbandoned(tb testing.TB, store *Store, id int64) recordstore.RecordInfo {
	tb.Helper()
	return requireState(tb, store, id, Abandoned)
}

func requireState(tb testing.TB, store *Store, id int64, want State) recordstore.RecordInfo {
	tb.Helper()
	info, found := store.Record(id)
	switch {
	case !found:
		tb.Fatalf("outboxtest: no record %d was saved%s", id, savedElsewhere(store))
	case info.State != want:
		tb.Fatalf("outboxtest: record %d is %s, want %s:\n%s", id, info.State, want, describe([]recordstore.RecordInfo{info}))
	}
	return info
}

// savedElsewhere names the topics the store has records of, for a failure
// message.
func savedElsewhere(store *Store) string {
	topics := store.topics()
	if len(topics) == 0 {
		return "; the store has no records at all (is the topic tracked in the registry, and was the registry built with NewRegistry?)"
	}
	return fmt.Sprintf("; the store has records of %q", topics)
}

// describe lists records one a line, for a failure message.
func describe(infos []recordstore.RecordInfo) string {
	var b strings.Builder
	for _, info := range infos {
		fmt.Fprintf(&b, "\trecord %d (uuid %s): %s", info.ID, info.UUID, info.State)
		if info.Attempts > 0 {
			fmt.Fprintf(&b, " after %d failed attempt(s), last error %q", info.Attempts, info.LastError)
		}
		for _, d := range info.Deliveries {
			fmt.Fprintf(&b, "; %s: %s", d.Consumer, d.State)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
