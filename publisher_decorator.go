package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// NewPublisher wraps pub so that messages published to a tracked topic are
// saved as records, in one round trip on the store's own connection, before
// they are sent with their record id in [MetadataID]; messages to other
// topics go straight to pub. If the insert fails it returns an
// [*InsertError] and sends nothing (nothing was saved unless the error
// matches [ErrOutcomeUnknown]); if pub fails, a [*SendError], and the
// records stay pending for the next replay. The insert runs on the first
// message's context without its cancellation, bounded by
// [DefaultStatementTimeout], and Publish returns by that context's deadline
// plus 100 milliseconds. Messages a handler of a tracked message returns
// are saved keyed by that delivery and position, so a rerun sends the
// records of the first run.
func NewPublisher(reg *Registry, pub message.Publisher) (message.Publisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	if !reg.enabled {
		return pub, nil
	}
	return &publisher{pub: pub, reg: reg}, nil
}

// PublisherDecorator returns a decorator for Router.AddPublisherDecorators
// that applies [NewPublisher] to every handler's publisher.
func PublisherDecorator(reg *Registry) message.PublisherDecorator {
	return func(pub message.Publisher) (message.Publisher, error) {
		return NewPublisher(reg, pub)
	}
}

type publisher struct {
	pub message.Publisher
	reg *Registry
}

func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	t := p.reg.lookup(topic)
	if t == nil {
		return p.pub.Publish(topic, msgs...)
	}
	return p.publishTracked(t, msgs)
}

func (p *publisher) publishTracked(t *tracked, msgs []*message.Message) error {
	if len(msgs) == 0 {
		return p.pub.Publish(t.topic, msgs...)
	}
	tr := p.reg.tracer()
	if tr == nil {
		return p.saveAndSend(t, msgs)
	}
	if err := nilMessage(t, msgs); err != nil {
		return err
	}
	end := tr.TracePublish(t.topic, msgs, false)
	err := p.saveAndSend(t, msgs)
	endStep(end, err)
	return err
}

// saveAndSend saves and sends a tracked publish. When it fails for messages
// a tracked delivery's handler produced, it counts the failure against that
// delivery before the router sees the error and nacks.
func (p *publisher) saveAndSend(t *tracked, msgs []*message.Message) error {
	err := p.save(t, msgs)
	if err != nil {
		producedFailed(msgs, err)
	}
	return err
}

func (p *publisher) save(t *tracked, msgs []*message.Message) error {
	records, err := recordsOf(t, msgs)
	if err != nil {
		return err
	}
	ctx := publishContext(msgs)
	identity, err := p.insert(ctx, t, records)
	if err != nil {
		return err
	}
	stamp(t, identity, msgs, records)
	if t.ordersRemote() {
		if ctx.Err() != nil {
			return &SendError{Topic: t.topic, IDs: recordIDs(records), Err: fmt.Errorf("the publish's context ended while its records were saved: %w", context.Cause(ctx))}
		}
		return sendStamped(ctx, p.pub, p.reg, t, msgs, records, true)
	}
	var before map[int64]int64
	if t.firstCopies.On.Load() && t.completedBy == ByConsumers && t.receivedHere() {
		if t.orderKey == "" {
			t.firstCopies.Saved(records, nil)
		} else {
			before = p.savedOrdered(ctx, t, records)
		}
	}
	if ctx.Err() != nil {
		return &SendError{Topic: t.topic, IDs: recordIDs(records), Err: fmt.Errorf("the publish's context ended while its records were saved: %w", context.Cause(ctx))}
	}
	if before != nil {
		return p.sendOrdered(t, msgs, records, before)
	}
	return sendRecorded(p.pub, p.reg, t, msgs, records)
}

// receivedHere is false when this process does not receive the topic: a
// router with [ReplayPlugin] started without a handler of it, and no
// delivery of it came since. A publish then remembers no record for its
// first copy (and, on an ordered topic, reads no earlier record of a key
// and holds no message): a process that publishes a topic others handle
// would pay for that and never use it. A first copy that comes here all
// the same is checked, as any copy.
func (t *tracked) receivedHere() bool {
	return !t.unreceived.Load()
}

// savedOrdered remembers the records a publish saved to an ordered topic,
// with the earlier record of its key each waits for, read from a store
// that tells (recordstore.KeyPredecessors) in one statement, and returns
// them by record id. When the store cannot tell, or the read fails,
// nothing is remembered, and it returns nil: each first copy is checked.
func (p *publisher) savedOrdered(ctx context.Context, t *tracked, records []recordstore.Record) map[int64]int64 {
	kp, ok := t.store.(recordstore.KeyPredecessors)
	if !ok {
		return nil
	}
	before := make(map[int64]int64, len(records))
	earlier, ids := earlierInBatch(records, func(r recordstore.Record) string { return r.OrderKey })
	for _, r := range records {
		if r.OrderKey == "" {
			// Not ordered: it waits for no record.
			before[r.ID] = 0
		}
	}
	for id, i := range earlier {
		before[id] = records[i].ID
	}
	if len(ids) > 0 {
		readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), insertTimeout)
		got, err := kp.Predecessors(readCtx, t.topic, ids)
		cancel()
		if err != nil {
			p.reg.logger().Debug("Reading the earlier records of the keys of a publish failed; their first copies are checked", watermill.LogFields{"topic": t.topic, "error": err.Error()})
			return nil
		}
		maps.Copy(before, got)
	}
	t.firstCopies.Saved(records, before)
	return before
}

// earlierInBatch finds the earlier record of their key that records
// saved by one insert (in the order of their ids) wait for without a read
// of the store: the batch's own latest earlier record of the key, when
// every id between the two is the batch's, drawn one after the other, so
// that no other record of the key lies between them. earlier gives, by
// record id, that record's index in records; read are the ids of the
// other records with a key, whose earlier record only the store knows.
func earlierInBatch(records []recordstore.Record, keyOf func(recordstore.Record) string) (earlier map[int64]int, read []int64) {
	earlier = map[int64]int{}
	last := map[string]int{}
	run := 0 // the first index of the run of consecutive ids that holds i
	for i, r := range records {
		if i > 0 && r.ID != records[i-1].ID+1 {
			run = i
		}
		k := keyOf(r)
		if k == "" {
			continue
		}
		if j, ok := last[k]; ok && j >= run {
			earlier[r.ID] = j
		} else {
			read = append(read, r.ID)
		}
		last[k] = i
	}
	return earlier, read
}

// insertTimeout bounds a tracked publish's insert, which runs on the
// message's context without its cancellation: a caller that gives up while
// the statement or its commit is on its way would otherwise be left not
// knowing whether the records were saved. A variable for the tests.
var insertTimeout = DefaultStatementTimeout

// insertGrace is how long a publish whose context ended waits for an
// insert on its way before it returns an unknown outcome: an answer that
// is about to come makes the outcome known. A variable for the tests.
var insertGrace = 100 * time.Millisecond

// insert reads the table's identity and saves the records, on ctx's values
// without its cancellation, within insertTimeout. When ctx can end, the
// insert runs in a goroutine of its own, so that the publish returns by
// ctx's end plus insertGrace: an insert still on its way then is an
// unknown outcome, and it goes on to its own end (the registry's
// WaitCompletions waits for it), so that records it saves are sent by the
// stale resubmitter or the next replay.
func (p *publisher) insert(ctx context.Context, t *tracked, records []recordstore.Record) (string, error) {
	saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), insertTimeout)
	if ctx.Done() == nil {
		defer cancel()
		return insertRecords(saveCtx, t, records)
	}
	type result struct {
		identity string
		err      error
	}
	done := make(chan result, 1)
	p.reg.background.Spawn(func() {
		defer cancel()
		identity, err := insertRecords(saveCtx, t, records)
		done <- result{identity, err}
	})
	select {
	case r := <-done:
		return r.identity, r.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(insertGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		return r.identity, r.err
	case <-grace.C:
		return "", &InsertError{Topic: t.topic, Count: len(records), OutcomeUnknown: true,
			Err: fmt.Errorf("%w: the publish's context ended before the database answered: %w", recordstore.ErrOutcomeUnknown, context.Cause(ctx))}
	}
}

// insertRecords reads the table's identity and saves the records.
func insertRecords(ctx context.Context, t *tracked, records []recordstore.Record) (string, error) {
	identity, err := t.store.Identity(ctx)
	if err != nil {
		return "", &InsertError{Topic: t.topic, Count: len(records), Err: err}
	}
	if err := t.store.Insert(ctx, records); err != nil {
		return "", &InsertError{Topic: t.topic, Count: len(records), Err: err, OutcomeUnknown: errors.Is(err, recordstore.ErrOutcomeUnknown)}
	}
	return identity, nil
}

// recordsOf builds the records of a tracked publish. A message that already
// carries outbox keys (published again after a failed send, or forwarded)
// is saved without them. A message the handler of a tracked delivery
// produced is keyed by that delivery and its position ([produced.origin]).
func recordsOf(t *tracked, msgs []*message.Message) ([]recordstore.Record, error) {
	if err := nilMessage(t, msgs); err != nil {
		return nil, err
	}
	records := make([]recordstore.Record, len(msgs))
	for i, msg := range msgs {
		records[i] = recordstore.Record{Topic: t.topic, UUID: msg.UUID, Payload: msg.Payload, Metadata: withoutOutboxKeys(msg.Metadata), Consumers: t.deliveries}
		if pr := producedBy(msg); pr != nil {
			records[i].Origin = pr.origin(t.topic)
		}
		if t.orderKey != "" {
			records[i].OrderKey = msg.Metadata[t.orderKey]
		}
	}
	return records, nil
}

// nilMessage refuses a publish with a nil message before anything is
// saved or traced.
func nilMessage(t *tracked, msgs []*message.Message) error {
	for i, msg := range msgs {
		if msg == nil {
			return &InsertError{Topic: t.topic, Count: len(msgs), Err: fmt.Errorf("%w: message #%d is nil", ErrInvalidConfig, i)}
		}
	}
	return nil
}

// stamp puts the record ids, the tracked topic, the table's identity and,
// for a topic with remote consumers, the confirmation topic into the
// messages. A keyed message first becomes its saved record (UUID, payload,
// metadata), which is the first run's when this is a rerun, so that
// receivers take the copy for the record it is.
func stamp(t *tracked, identity string, msgs []*message.Message, records []recordstore.Record) {
	for i, msg := range msgs {
		if r := &records[i]; r.Origin != "" {
			msg.UUID, msg.Payload, msg.Metadata = r.UUID, r.Payload, r.Metadata
		}
		if msg.Metadata == nil {
			msg.Metadata = make(message.Metadata, 4)
		}
		stampKeys(msg.Metadata, t, identity, records[i].ID)
	}
}

func stampKeys(md message.Metadata, t *tracked, identity string, id int64) {
	md[MetadataID] = strconv.FormatInt(id, 10)
	md[MetadataTopic] = t.topic
	md[MetadataTable] = identity
	if t.confirmTo != "" {
		md[MetadataConfirmTo] = t.confirmTo
	}
}

// sendRecorded sends messages whose records are saved; a failure leaves the
// records pending and names them. On a topic that completes on send, the
// records are completed once the send succeeded.
func sendRecorded(pub message.Publisher, reg *Registry, t *tracked, msgs []*message.Message, records []recordstore.Record) error {
	if err := pub.Publish(t.topic, msgs...); err != nil {
		return &SendError{Topic: t.topic, IDs: recordIDs(records), Err: err}
	}
	reg.observer().Published(t.topic, len(msgs))
	if t.completedBy == OnSend {
		completeSent(publishContext(msgs), reg, t, records)
	}
	return nil
}

func recordIDs(records []recordstore.Record) []int64 {
	ids := make([]int64, len(records))
	for i := range records {
		ids[i] = records[i].ID
	}
	return ids
}

// publishContext is the context of the first message; Watermill messages carry
// their own context and Publish has no other.
func publishContext(msgs []*message.Message) context.Context {
	return msgs[0].Context()
}

func (p *publisher) Close() error { return p.pub.Close() }

// Unwrap returns the wrapped publisher.
func (p *publisher) Unwrap() message.Publisher { return p.pub }
