package recordstore

import (
	"context"
	"encoding/json"
	"time"
)

// The interfaces below are optional: a [Store] that implements them gets the
// operational features, found by type assertion, and a store that does not
// keeps working without them. The sqlstore package's stores implement all of
// them.

// FailureRecorder is implemented by a [Store] that counts failed handlings.
// The middleware calls it only when a handler fails, never on success.
type FailureRecorder interface {
	// RecordFailure adds one to the attempts of the pending delivery (the
	// consumer's own, on a record that declares consumers) and keeps reason
	// (the store may shorten it, and replace what it cannot keep, such as
	// bytes that are not UTF-8: the failure is counted whatever its
	// text). When maxAttempts > 0 and the attempts
	// reach it, the delivery is abandoned: no longer pending for this
	// consumer, never handled again by it, but kept and visible; a record
	// is abandoned once none of its deliveries is pending and one was
	// abandoned. It returns the attempts so far and whether the delivery
	// was abandoned, and ErrNotPending, changing nothing, when it was not
	// pending.
	//
	// Unless it abandons, it also makes the delivery due again only after
	// retryIn(attempts), by the database clock: until then CheckPending
	// reports a [*NotDueError] and ClaimStale passes the record over. A
	// zero delay (or a nil retryIn) makes it due at once.
	RecordFailure(ctx context.Context, d Delivery, reason string, maxAttempts int, retryIn func(attempts int) time.Duration) (attempts int, abandoned bool, err error)
}

// BatchCompleter is implemented by a [Store] that completes many deliveries
// with one call. The middleware hands it the completions that one
// Complete.BatchWait window gathered for a topic, at once, rather than one
// Complete call each, so that a store can complete them all with one
// statement. A wrapper that embeds such a store to see its Complete calls
// must override CompleteBatch as well.
type BatchCompleter interface {
	// CompleteBatch completes each delivery as Complete would and returns
	// each one's outcome, in the order of ds: nil, ErrNotPending, or an
	// error. One delivery's refused value or missing record fails no other
	// delivery.
	CompleteBatch(ctx context.Context, ds []Delivery) []error
}

// Requeuer is implemented by a [Store] whose abandoned records can be
// made pending again.
type Requeuer interface {
	// Requeue makes the abandoned record pending again, with the
	// attempts of its abandoned deliveries reset (the deliveries other
	// consumers completed stay complete), and returns it so that the caller
	// sends it. It returns an error wrapping ErrNotAbandoned when the
	// record is not abandoned.
	Requeue(ctx context.Context, id int64) (Record, error)
}

// StaleClaimer is implemented by a [Store] that can find pending records
// whose last send is older than an age, for the outbox.StaleResubmitter.
type StaleClaimer interface {
	// ClaimStale returns up to limit pending records of topic with an id
	// above afterID, last sent more than olderThan ago by the database
	// clock, and due (see [FailureRecorder]: a delivery waiting for its
	// retry is not), ordered by id, and records them as sent now, so that
	// no other claim returns them until olderThan has passed again.
	// Concurrent claims never return the same record. A record with an
	// order key ([Record.OrderKey]) is claimed only while no earlier record
	// of its key is pending: a later one would only be held. afterID is a
	// cursor:
	// a round of claims passes the last id of the previous claim, so that
	// it walks the backlog once even when olderThan is shorter than the
	// round.
	ClaimStale(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit int) ([]Record, error)
}

// KeyClaimer is implemented by a [Store] that can claim the next record of
// an order key ([Record.OrderKey]): the outbox sends it again when a record
// of the key completes, or when a held record asks for the record that
// holds it, so that a record held and put back comes back without waiting
// for the stale resubmitter.
type KeyClaimer interface {
	// ClaimKey is [StaleClaimer.ClaimStale] of at most one record: the
	// head of the order key after afterID, that is the first pending
	// record of topic with the key and an id above afterID, when it is due
	// and its last send is more than olderThan ago. It records it as sent
	// now, so that concurrent claims return it once per olderThan. A later
	// record of the key is never claimed, even when the head cannot be:
	// it would only be held again.
	ClaimKey(ctx context.Context, topic, key string, afterID int64, olderThan time.Duration) ([]Record, error)
	// PutBack records that a copy of the pending record id of topic was
	// acknowledged without being handled, because an earlier record of its
	// key held it: its last send moves far into the past, so that the next
	// ClaimKey, stale claim or replay by claims sends it again whatever
	// olderThan. A record that is not pending is left as it is.
	PutBack(ctx context.Context, topic string, id int64) error
}

// KeyPredecessors is implemented by a [KeyClaimer] that can tell, right
// after a publish, which earlier record of its key each new record waits
// for. The outbox asks it for the records its publisher has just saved, so
// that the first copy of a record whose predecessor this process has
// handled, or which has none, needs no check before its handler runs.
type KeyPredecessors interface {
	// Predecessors returns, for each record of ids (records of topic with
	// an order key) that is not complete, the id of the latest earlier
	// record of its key that is not complete for some consumer (pending,
	// or abandoned), or 0 when there is none. A record that is complete,
	// or not found, is left out.
	Predecessors(ctx context.Context, topic string, ids []int64) (map[int64]int64, error)
}

// KeyPredecessorMessages is implemented by a [KeyPredecessors] that can
// also name the message of each earlier record: the outbox stamps it into
// the messages of a topic with an order key and receivers in other
// services (outbox.MetadataAfter), whose inboxes then hold a message until
// the one it names is handled.
type KeyPredecessorMessages interface {
	// PredecessorMessages is [KeyPredecessors.Predecessors] with the UUID
	// of each earlier record; a record with none maps to a zero
	// [Predecessor]. With skipAbandoned, a record abandoned for every
	// consumer (no delivery of it pending) is passed over, as it holds no
	// consumer's key (outbox.Tracked.OrderSkipsAbandoned).
	PredecessorMessages(ctx context.Context, topic string, ids []int64, skipAbandoned bool) (map[int64]Predecessor, error)
}

// Predecessor is the latest earlier record of a record's order key that is
// not complete for some consumer: its id and its message's UUID.
type Predecessor struct {
	ID   int64
	UUID string
}

// KeyWaiters is implemented by a [KeyClaimer] that can tell, in one
// statement, which of many order keys have a record waiting to be sent
// again: the outbox asks it after a batch of completions, and claims the
// next record ([KeyClaimer.ClaimKey]) only of the keys it names.
type KeyWaiters interface {
	// WaitingKeys returns the keys among keys (order keys of topic) that
	// have a pending record whose last send is more than olderThan ago, or
	// that was put back ([KeyClaimer.PutBack]). It may name a key whose
	// record ClaimKey then does not claim (not the head, or not due); it
	// never leaves out a key whose head ClaimKey would claim.
	WaitingKeys(ctx context.Context, topic string, keys []string, olderThan time.Duration) ([]string, error)
}

// ReplayClaimer is implemented by a [StaleClaimer] that can claim the
// records a startup replay sends: outbox.Replay uses it, when the store has
// it, for a replay by claims (outbox.ReplayClaimed).
type ReplayClaimer interface {
	// ClaimReplay is ClaimStale, with the byte budget of
	// [ByteBoundedReader.ClaimStaleBytes], that also returns the records
	// never sent again after the publish that saved them (not claimed,
	// stamped, made due nor requeued since), whatever their age: the
	// store cannot tell whether that publish's send reached the broker, so
	// the first start after it sends them once.
	ClaimReplay(ctx context.Context, topic string, afterID int64, grace time.Duration, limit, maxBytes int) ([]Record, error)
}

// SpacedClaimer is implemented by a [StaleClaimer] that spaces the resends
// of a record by how long it has waited: the outbox.StaleResubmitter uses
// it for the topics with remote consumers, which confirm each delivery over
// the broker, so that a lost copy or a lost confirmation is sent again soon
// and a receiver that is down is not flooded.
type SpacedClaimer interface {
	// ClaimSpaced is [ByteBoundedReader.ClaimStaleBytes] whose age grows
	// with the record's wait: a record is claimed when its last send is
	// older than minAge and than twice the time from its save to that
	// send, or older than maxAge. A record never sent again waits minAge;
	// each resend then doubles the wait, up to maxAge.
	ClaimSpaced(ctx context.Context, topic string, afterID int64, minAge, maxAge time.Duration, limit, maxBytes int) ([]Record, error)
}

// ByteBoundedReader is implemented by a [Store] that can end a page of
// records at a byte budget, so that a backlog of large payloads is read a
// few records at a time: outbox.Replay and the outbox.StaleResubmitter use
// it when the store has it.
type ByteBoundedReader interface {
	// PendingAfterBytes is PendingAfter that stops after the record that
	// brings the payload and metadata bytes of the page to maxBytes, or
	// beyond; it returns at least one record when one is pending. A
	// maxBytes of 0 sets no budget.
	PendingAfterBytes(ctx context.Context, topic string, afterID int64, limit, maxBytes int) ([]Record, error)
	// ClaimStaleBytes is ClaimStale with the budget of PendingAfterBytes;
	// only the records it returns are claimed.
	ClaimStaleBytes(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit, maxBytes int) ([]Record, error)
}

// Size is the bytes of a record's payload and metadata, which a page's
// byte budget counts.
func (r *Record) Size() int {
	n := len(r.Payload)
	for k, v := range r.Metadata {
		n += len(k) + len(v)
	}
	return n
}

// Cleaner is implemented by a [Store] that keeps completed records and can
// delete them, for the outboxops.Cleaner.
type Cleaner interface {
	// Clean deletes up to limit completed, not abandoned records
	// completed more than olderThan ago by the database clock, and returns
	// how many it deleted.
	Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// ConsumerRetirer is implemented by a [Store] that can retire a consumer a
// topic no longer declares, for outboxops.RetireConsumer and operators' tools.
type ConsumerRetirer interface {
	// Retire completes every pending delivery of consumer to the records
	// of topic, as if the consumer had handled them, and rolls each record
	// up: it is completed (marked, or deleted) once none of its deliveries
	// is pending, abandoned if one was abandoned. It works in bounded
	// batches, each committed on its own, so that a retire stopped half way
	// keeps what it did and can be run again. It returns how many
	// deliveries it completed; zero, and no error, when the consumer has
	// none pending. Records saved without consumers are not touched.
	//
	// A store that is also a [ConsumerDeclarer] refuses, completing
	// nothing, a consumer that the topic's latest declaration lists: it
	// returns a [*ConsumerDeclaredError]. A topic never declared in the
	// store is retired as asked.
	Retire(ctx context.Context, topic, consumer string) (int, error)
}

// Declaration is what one start of a service declares of one tracked
// topic: its consumers in services that share the store, and its remote
// consumers, which confirm over the broker (outbox.Tracked.Consumers and
// RemoteConsumers). A topic with one receiver declares neither.
type Declaration struct {
	Topic           string
	Consumers       []string
	RemoteConsumers []string
}

// ConsumerDeclarer is implemented by a [Store] that keeps what the latest
// start of a service declared of each of its topics, so that tools without
// the service's registry know it: its [ConsumerRetirer] refuses a consumer
// still declared, and its [StatusReader] tells remote consumers
// ([ConsumerStatus.Remote]).
type ConsumerDeclarer interface {
	// DeclareConsumers records the declarations of a start, by the
	// database clock, in one statement: each topic's declaration replaces
	// the one an earlier start wrote, so that a consumer it no longer
	// lists stops counting as declared. Topics it does not name keep
	// theirs. outbox.Replay calls it once per store at each start.
	DeclareConsumers(ctx context.Context, decls []Declaration) error
}

// TopicStatus is the state of one tracked topic's records in its store.
type TopicStatus struct {
	// Topic is the records' topic.
	Topic string
	// Pending is how many records wait to be completed.
	Pending int64
	// OldestPending is the age of the oldest pending record by the
	// database clock, from its creation; zero when none is pending.
	OldestPending time.Duration
	// Abandoned is how many records were abandoned; Completed how many
	// completed records the table keeps (always zero on a deleting table).
	// Both are zero in the result of PendingStatus.
	Abandoned int64
	Completed int64
	// Unchecked is how many of the pending records wait for a consumer
	// that was never seen ([ConsumerRecorder]): a record saved without
	// consumers when no consumer of the topic was ever seen, a record
	// saved with consumers when one of its pending deliveries is of a
	// consumer never seen. Nothing completes such a record until that
	// consumer runs; zero on a store that does not implement
	// [ConsumerRecorder].
	Unchecked int64
	// Seen reports whether a consumer of the topic was ever seen, and
	// SinceSeen how long ago the most recent one was, by the database
	// clock (zero when never). The outbox records a consumer at most once
	// a minute per process, so SinceSeen runs up to a minute late.
	Seen      bool
	SinceSeen time.Duration
	// HeldKeys is how many order keys ([Record.OrderKey]) have an
	// abandoned record followed by pending ones: the later records are
	// held until the abandoned one is requeued (unless the topic skips
	// abandoned records, outbox.Tracked.OrderSkipsAbandoned). Zero on a
	// store without order keys.
	HeldKeys int64
	// Consumers breaks the counts down per declared consumer, for names
	// whose records declare consumers, in consumer order; nil otherwise.
	Consumers []ConsumerStatus
}

// ConsumerStatus is the state of one consumer's deliveries of one tracked
// name: Pending counts the records this consumer has still to complete,
// OldestPending the age of the oldest of them. Abandoned and Completed
// are zero in the result of PendingStatus. Unchecked is Pending when the
// consumer was never seen ([ConsumerRecorder]) and zero once it was; Seen
// and SinceSeen are the consumer's own, as in [TopicStatus].
//
// Remote reports a remote consumer (outbox.Tracked.RemoteConsumers), as
// the latest declaration that listed it says ([ConsumerDeclarer]): its
// Pending deliveries await its confirmation over the broker, the oldest
// for OldestPending. False on a store that keeps no declarations, unless
// outboxops.ReadStatus sets it from the registry.
type ConsumerStatus struct {
	Consumer      string
	Pending       int64
	OldestPending time.Duration
	Abandoned     int64
	Completed     int64
	Unchecked     int64
	Seen          bool
	SinceSeen     time.Duration
	Remote        bool
}

// ConsumerRecorder is implemented by a [Store] that remembers which
// consumers of each topic it has seen, so that its [StatusReader] reports
// the records that wait for a consumer never seen ([TopicStatus.Unchecked]):
// a remote consumer whose service never confirms, a declared consumer never
// deployed. A store that implements it reports Unchecked, Seen and
// SinceSeen in its status; one that does not leaves them zero.
type ConsumerRecorder interface {
	// SawConsumer records that consumer (a handler name; "" outside a
	// router) checked a record of topic, or confirmed one, now by the
	// database clock: it keeps when the pair was first and last seen. The
	// outbox calls it at most once a minute per pair and process, off the
	// handler's path.
	SawConsumer(ctx context.Context, topic, consumer string) error
}

// StatusReader is implemented by a [Store] that can report its backlog, for
// metrics, the status handler and operators' tools.
type StatusReader interface {
	// PendingStatus reports Pending and OldestPending of every name with
	// pending records, read from the pending records only, so it stays
	// cheap however many completed records the table keeps.
	PendingStatus(ctx context.Context) ([]TopicStatus, error)
	// Status reports every field of every name with records; it reads the
	// whole table.
	Status(ctx context.Context) ([]TopicStatus, error)
}

// SendStamper is implemented by a [Store] that records when a record was
// last sent. Startup replay calls it once per page it sent, so that the
// outbox.StaleResubmitter counts from the replay rather than from the record's
// creation.
type SendStamper interface {
	// StampSent sets the last send time of the records to now, by the
	// database clock.
	StampSent(ctx context.Context, ids []int64) error
}

// topicStatusJSON is the JSON shape of a [TopicStatus], written by its
// MarshalJSON and read by its UnmarshalJSON.
type topicStatusJSON struct {
	Topic         string           `json:"topic"`
	Pending       int64            `json:"pending"`
	OldestPending float64          `json:"oldest_pending_seconds"`
	Abandoned     int64            `json:"abandoned"`
	Completed     int64            `json:"completed"`
	Unchecked     int64            `json:"unchecked"`
	LastSeen      *float64         `json:"last_seen_seconds_ago"`
	HeldKeys      int64            `json:"held_keys"`
	Consumers     []ConsumerStatus `json:"consumers,omitempty"`
}

// MarshalJSON writes the status with snake_case keys and ages in seconds, as
// dashboards read it (the status handler, outboxctl status -json);
// last_seen_seconds_ago is null when no consumer was ever seen.
func (s TopicStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(topicStatusJSON{s.Topic, s.Pending, s.OldestPending.Seconds(), s.Abandoned, s.Completed, s.Unchecked,
		secondsAgo(s.Seen, s.SinceSeen), s.HeldKeys, s.Consumers})
}

// UnmarshalJSON reads what MarshalJSON writes, so that a client of the
// status handler or of outboxctl decodes it into the type.
func (s *TopicStatus) UnmarshalJSON(b []byte) error {
	var j topicStatusJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	seen, since := lastSeenOf(j.LastSeen)
	*s = TopicStatus{Topic: j.Topic, Pending: j.Pending, OldestPending: seconds(j.OldestPending), Abandoned: j.Abandoned, Completed: j.Completed,
		Unchecked: j.Unchecked, Seen: seen, SinceSeen: since, HeldKeys: j.HeldKeys, Consumers: j.Consumers}
	return nil
}

// consumerStatusJSON is the JSON shape of a [ConsumerStatus].
type consumerStatusJSON struct {
	Consumer      string   `json:"consumer"`
	Remote        bool     `json:"remote"`
	Pending       int64    `json:"pending"`
	OldestPending float64  `json:"oldest_pending_seconds"`
	Abandoned     int64    `json:"abandoned"`
	Completed     int64    `json:"completed"`
	Unchecked     int64    `json:"unchecked"`
	LastSeen      *float64 `json:"last_seen_seconds_ago"`
}

// MarshalJSON writes the status with snake_case keys and ages in seconds;
// a remote consumer's pending deliveries are those awaiting its
// confirmation.
func (s ConsumerStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(consumerStatusJSON{s.Consumer, s.Remote, s.Pending, s.OldestPending.Seconds(), s.Abandoned, s.Completed, s.Unchecked,
		secondsAgo(s.Seen, s.SinceSeen)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *ConsumerStatus) UnmarshalJSON(b []byte) error {
	var j consumerStatusJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	seen, since := lastSeenOf(j.LastSeen)
	*s = ConsumerStatus{Consumer: j.Consumer, Remote: j.Remote, Pending: j.Pending, OldestPending: seconds(j.OldestPending), Abandoned: j.Abandoned,
		Completed: j.Completed, Unchecked: j.Unchecked, Seen: seen, SinceSeen: since}
	return nil
}

// secondsAgo is a last-seen age in seconds, nil when never seen.
func secondsAgo(seen bool, since time.Duration) *float64 {
	if !seen {
		return nil
	}
	s := since.Seconds()
	return &s
}

// lastSeenOf reads a last-seen age in seconds, nil when never seen.
func lastSeenOf(secs *float64) (seen bool, since time.Duration) {
	if secs == nil {
		return false, 0
	}
	return true, seconds(*secs)
}

// seconds is an age in seconds as a duration.
func seconds(secs float64) time.Duration { return time.Duration(secs * float64(time.Second)) }
