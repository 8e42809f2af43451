package outbox

// Admission: whether a delivered message with outbox metadata is this
// service's and this consumer's to track, and whether its record is pending.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// admission is a tracked message on its way to the handler.
type admission struct {
	t      *tracked
	d      recordstore.Delivery
	idText string
	// identity is the table identity the message carried (and admission
	// checked), put back with the other outbox keys after a failure.
	identity string
	fields   watermill.LogFields
	// seen is the receiver's throttle of the records it saw
	// (receivers_seen.go).
	seen *atomic.Int64
	// ordered is the delivery's place among the running handlers of an
	// ordered topic, once it has one, and key the message's order key
	// (ordering.go).
	ordered heldKey
	key     string
	// unchecked is set on a first copy of an ordered topic that runs
	// without the check (first_copy.go): it completes in the background.
	unchecked bool
}

// admit decides whether the message is this consumer's to handle and
// tracks, and checks its record.
func (m *middleware) admit(msg *message.Message, idText string) (*admission, observe.CheckOutcome, error) {
	ctx := msg.Context()
	name := msg.Metadata[MetadataTopic]
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		// Outside a router there is no subscription to trust.
		topic = name
	}
	consumer := message.HandlerNameFromCtx(ctx)
	t := m.reg.lookup(topic)
	if t == nil {
		// Another service's tracked message (or a record of a topic this
		// service does not track): its receiver side.
		return nil, checkForeign, nil
	}
	if name != topic {
		m.notOwned(msg, topic, consumer, "the message's record is another topic's")
		return nil, observe.CheckUntracked, nil
	}
	id, perr := parseID(idText)
	// One deadline bounds the whole check: the identity (read once per
	// pool, then cached) and the record.
	checkCtx, cancel := context.WithTimeout(ctx, m.cfg.Check.Timeout)
	defer cancel()
	identity, err := t.store.Identity(checkCtx)
	if err != nil {
		m.hold(ctx, m.checks.Failed())
		return nil, observe.CheckRefused, &CheckError{Topic: topic, ID: id, Err: fmt.Errorf("reading the table identity: %w", err)}
	}
	if msg.Metadata[MetadataTable] != identity {
		// Another service tracks a topic of the same name in its own
		// table: its receiver side.
		return nil, checkForeign, nil
	}
	if t.completedBy == OnSend {
		// Complete since it was sent: nothing for a receiver to check.
		m.notOwned(msg, topic, consumer, "the topic completes on send")
		return nil, observe.CheckUntracked, nil
	}
	if err := perr; err != nil {
		// Nacking would bring the same message back without end; it has
		// no record to complete, so it is handled once, untracked.
		m.logger.Error("Malformed outbox metadata; handling the message untracked", fmt.Errorf("message %s of %q: %w", msg.UUID, name, err),
			watermill.LogFields{"message_uuid": msg.UUID, "topic": name, "consumer": consumer})
		m.reg.observer().NotOwned(topic, consumer)
		return nil, observe.CheckUntracked, nil
	}
	if !m.admitsConsumer(t, consumer) {
		m.reg.observer().NotOwned(topic, consumer)
		return nil, observe.CheckUntracked, nil
	}
	if t.unreceived.Load() {
		t.unreceived.Store(false)
	}
	a := &admission{t: t, idText: idText, identity: identity,
		d: recordstore.Delivery{ID: id, Topic: topic, Consumer: consumer, Declared: t.deliveries, UUID: msg.UUID,
			Lease: m.leasePrefix + strconv.FormatUint(m.leaseSeq.Add(1), 36), Ordered: t.orderKey != "", SkipAbandoned: t.skipAbandoned},
		fields: watermill.LogFields{"message_uuid": msg.UUID, "topic": name, "outbox_id": id, "consumer": consumer},
		seen:   t.seenSlot(consumer)}
	if t.orderKey != "" {
		a.key = msg.Metadata[t.orderKey]
	}
	if c, ok := t.completing.Load(completingKey{id: id, consumer: consumer}); ok {
		// A copy of a delivery whose completion runs in the background:
		// its check waits for the completion, and finds it done.
		select {
		case <-c.(*completion).done:
		case <-checkCtx.Done():
		}
	}
	var o observe.CheckOutcome
	if tr := m.reg.tracer(); tr != nil {
		o, err = m.tracedCheck(tr, msg, checkCtx, a)
	} else {
		o, err = m.check(ctx, checkCtx, a)
	}
	if foundRecord(o, err) {
		m.reg.sawConsumer(t, a.seen, consumer, m.logger)
	}
	return a, o, err
}

// tracedCheck checks the record as admit does, in the delivery's and the
// check's contexts the tracer gives, under the same deadline. The message
// carries the delivery's context from then on.
func (m *middleware) tracedCheck(tr observe.Tracer, msg *message.Message, checkCtx context.Context, a *admission) (observe.CheckOutcome, error) {
	ref := RecordRef{Topic: a.t.topic, ID: a.d.ID, Consumer: a.d.Consumer}
	ctx := tr.TraceDelivery(msg.Context(), msg, ref)
	msg.SetContext(ctx)
	spanCtx, end := tr.TraceCheck(ctx, ref)
	if deadline, ok := checkCtx.Deadline(); ok {
		var cancel context.CancelFunc
		spanCtx, cancel = context.WithDeadline(spanCtx, deadline)
		defer cancel()
	}
	o, err := m.check(ctx, spanCtx, a)
	if end != nil {
		end(o, err)
	}
	return o, err
}

// check reads the record's state for the delivery's consumer within
// checkCtx; a copy it holds waits on ctx, the message's own.
func (m *middleware) check(ctx, checkCtx context.Context, a *admission) (observe.CheckOutcome, error) {
	o, err := m.checkRecord(ctx, checkCtx, a)
	var checkErr *CheckError
	if errors.As(err, &checkErr) && !errors.Is(err, recordstore.ErrLeased) {
		// The database did not answer: hold before the nack.
		m.hold(ctx, m.checks.Failed())
	} else {
		m.checks.Answered()
	}
	return o, err
}

// checkRecord reads the record's state, as check does.
func (m *middleware) checkRecord(ctx, checkCtx context.Context, a *admission) (observe.CheckOutcome, error) {
	err := m.checkPending(checkCtx, a)
	var conflict *recordstore.ConsumerConflictError
	var notDue *recordstore.NotDueError
	switch {
	case err == nil:
		return observe.CheckPending, nil
	case errors.Is(err, ErrNotPending):
		m.logger.Debug("Record already completed, acking copy without handling", a.fields)
		m.reg.observer().DuplicateSkipped(a.t.topic, a.d.Consumer)
		return observe.CheckDuplicate, nil
	case errors.Is(err, recordstore.ErrMessageMismatch):
		// The metadata names a record of this table, but the record was
		// saved for another message: running the handler would complete
		// the record with this message's payload, and the record's own
		// message would never be handled. It is not this record's
		// message, and no redelivery makes it one.
		m.logger.Error("Message names a record saved for another message; acking it without handling", err, a.fields)
		m.reg.observer().Mismatched(a.t.topic, a.d.Consumer)
		return observe.CheckMismatch, nil
	case errors.Is(err, recordstore.ErrInvalidValue):
		// The store cannot keep a value of the delivery (the handler's
		// name, say), so it cannot track it, and no redelivery changes
		// that: acked unrun, as a mismatch, the record left pending.
		m.logger.Error("The store cannot keep a value of the delivery; acking the message without handling", err, a.fields)
		m.reg.observer().Mismatched(a.t.topic, a.d.Consumer)
		return observe.CheckMismatch, nil
	case errors.As(err, &conflict) && len(a.t.consumers) > 0:
		// A store that does not adopt records saved before the topic
		// declared its consumers (see recordstore.Delivery.Declared).
		m.reportOnceAs(a.t, a.d.Consumer, conflict.CompletedBy, "Record saved before its topic declared consumers, completed by another", fmt.Sprintf("record %d of tracked topic %q was saved before the topic declared its consumers and was completed by %q; "+
			"%q handles it untracked so that it skips nothing. The store %T does not adopt such records (recordstore.Delivery.Declared)",
			a.d.ID, a.t.topic, conflict.CompletedBy, a.d.Consumer, a.t.store))
		m.reg.observer().NotOwned(a.t.topic, a.d.Consumer)
		return observe.CheckUntracked, nil
	case errors.As(err, &conflict):
		m.conflict(a.t, a.d.Consumer, conflict.CompletedBy)
		m.reg.observer().NotOwned(a.t.topic, a.d.Consumer)
		return observe.CheckUntracked, nil
	case errors.Is(err, recordstore.ErrUnknownRecord):
		warn(m.logger, "No record with this id in the topic's table (never saved, or cleaned up); acking without handling", a.fields)
		m.reg.observer().UnknownRecord(a.t.topic, a.d.Consumer)
		return observe.CheckUnknown, nil
	case errors.Is(err, recordstore.ErrNoDelivery):
		m.logger.Error("Record was saved before this consumer was declared; handling it untracked", err, a.fields)
		m.reg.observer().NotOwned(a.t.topic, a.d.Consumer)
		return observe.CheckUntracked, nil
	case errors.Is(err, recordstore.ErrHeld):
		// The middleware waits for the earlier record, then puts the
		// copy back (ordering.go).
		return observe.CheckRefused, err
	case errors.As(err, &notDue):
		m.logger.Debug("Record not due for its next attempt, holding and nacking the copy", a.fields.Add(watermill.LogFields{"wait": notDue.Wait}))
		m.hold(ctx, notDue.Wait)
		return observe.CheckRefused, err
	case errors.Is(err, recordstore.ErrLeased):
		m.logger.Debug("Record leased by another delivery, nacking copy without handling", a.fields)
		m.hold(ctx, m.cfg.Check.LeasedNackDelay)
		return observe.CheckRefused, &CheckError{Topic: a.t.topic, ID: a.d.ID, Err: err}
	}
	return observe.CheckRefused, &CheckError{Topic: a.t.topic, ID: a.d.ID, Err: err}
}

// checkPending is the store's check of the delivery. A message without a
// UUID would name no message ([recordstore.Delivery.UUID] ""), which the
// store takes for an operator's check by id alone, so that a forged message
// without one would pass for any record's: the record's UUID is read
// first, and a record saved for a message with a UUID is another
// message's. Only messages without a UUID pay for that read.
func (m *middleware) checkPending(ctx context.Context, a *admission) error {
	if a.t.orderKey != "" {
		if skip, before := m.skipsOrderedCheck(ctx, a); skip {
			return nil
		} else if before != 0 {
			return &heldHere{before: before}
		}
	} else if m.skipsFirstChecks(a) && a.t.firstCopies.Take(a.d, max(len(a.t.consumers), 1)) {
		// The first copy of a record this process has just published.
		return nil
	}
	if a.d.UUID == "" {
		recs, err := a.t.store.PendingAfter(ctx, a.d.Topic, a.d.ID-1, 1)
		if err != nil {
			return fmt.Errorf("reading the UUID of record %d: %w", a.d.ID, err)
		}
		if len(recs) == 1 && recs[0].ID == a.d.ID && recs[0].UUID != "" {
			return fmt.Errorf("record %d of %q was saved for a message with a UUID, and the message has none: %w", a.d.ID, a.d.Topic, recordstore.ErrMessageMismatch)
		}
	}
	return a.t.store.CheckPending(ctx, a.d)
}

// warner is a logger with a warning level, such as Watermill's slog
// adapter wrapped by the user; [watermill.LoggerAdapter] itself has none.
type warner interface {
	Warn(msg string, fields watermill.LogFields)
}

// warn logs at warning level where the logger has one, and at Info
// otherwise.
func warn(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) {
	if w, ok := logger.(warner); ok {
		w.Warn(msg, fields)
		return
	}
	logger.Info("WARNING: "+msg, fields)
}

// notOwned lets a message this service does not own through untracked.
// Receiving another service's tracked messages is normal, so it is counted
// and logged at Debug only.
func (m *middleware) notOwned(msg *message.Message, topic, consumer, why string) {
	m.logger.Debug("Message with outbox metadata this service does not own; handling it untracked", watermill.LogFields{
		"message_uuid": msg.UUID, "topic": topic, "consumer": consumer, "reason": why,
		"outbox_topic": truncate(msg.Metadata[MetadataTopic], 128), "outbox_id": truncate(msg.Metadata[MetadataID], 64),
	})
	m.reg.observer().NotOwned(topic, consumer)
}

// admitsConsumer reports whether the handler is the topic's consumer: one of
// the declared consumers, or, without a declaration, the first handler seen
// receiving the name. Any other handler is logged once and runs untracked,
// so it never takes another consumer's completion for a duplicate.
func (m *middleware) admitsConsumer(t *tracked, consumer string) bool {
	if len(t.consumers) > 0 {
		if t.declares(consumer) {
			return true
		}
		m.reportOnce(t, consumer, "", fmt.Sprintf("handler %q receives tracked topic %q but is not one of its declared consumers %q; it runs untracked. Add it to Tracked.Consumers to track it",
			consumer, t.topic, t.consumers))
		return false
	}
	if consumer == "" {
		// Outside a router the handler has no name to tell apart.
		return true
	}
	first := t.first.Load()
	if first == nil {
		// Deliveries that arrive together (a replay) race to be first;
		// every one of the winner's is the first receiver's too.
		if t.first.CompareAndSwap(nil, &consumer) {
			return true
		}
		first = t.first.Load()
	}
	if *first == consumer {
		return true
	}
	m.conflict(t, consumer, *first)
	return false
}

// conflict logs, once per pair, a second handler of a topic that declares
// no consumers.
func (m *middleware) conflict(t *tracked, consumer, other string) {
	m.reportOnce(t, consumer, other, fmt.Sprintf("handlers %q and %q both receive tracked topic %q, which declares no consumers; %q runs untracked so that it skips nothing. "+
		"Declare them: Tracked{Topic: %q, Consumers: []string{%q, %q}}", other, consumer, t.topic, consumer, t.topic, other, consumer))
}

func (m *middleware) reportOnce(t *tracked, consumer, other, text string) {
	m.reportOnceAs(t, consumer, other, "Tracked topic received by an undeclared consumer", text)
}

// reportOnceAs logs text at Error under title, once per pair of
// consumers.
func (m *middleware) reportOnceAs(t *tracked, consumer, other, title, text string) {
	if _, done := t.conflicts.LoadOrStore(consumer+"\x00"+other, struct{}{}); done {
		return
	}
	m.logger.Error(title, errors.New(text),
		watermill.LogFields{"topic": t.topic, "consumer": consumer, "other_consumer": other})
}

// First copies (MiddlewareConfig.Check.FirstCopies off): the publisher remembers
// the records it has just saved, and the first copy of each, per
// consumer, runs without the check.
//
// On a topic with an order key the publisher also asks the store, right
// after the insert, which earlier record of its key each new record waits
// for (recordstore.KeyPredecessors). The first copy of a record that waits
// for none, or for a record this consumer completed here, runs without the
// check: the earlier records of its key are done. When that record is on
// its way here (its first copy not yet delivered, its handler running or
// its completion not yet committed), the copy waits for it off the
// handler's path (ordering.go's park) and is sent again once it completed,
// so that a crash cannot make the earlier record run again after this one
// and the subscription goes on meanwhile. Any other copy is checked, and
// held as ordering.go says.

// skipsFirstChecks reports whether the first copies of a's records may skip
// the check at all: not with Check.FirstCopies, a message without a UUID,
// or a store with a delivery lease, which the check takes.
func (m *middleware) skipsFirstChecks(a *admission) bool {
	return !m.cfg.Check.FirstCopies && a.d.UUID != "" && !leases(a.t.store)
}

// leases reports whether the store has a delivery lease, which the check
// takes.
func leases(s recordstore.Store) bool {
	l, ok := s.(interface{ Lease() time.Duration })
	return !ok || l.Lease() > 0
}

// Receivers seen: the middleware and the confirmation handler tell the
// store which receivers check the records of each topic, so that its status
// reports the records that wait for a receiver never seen
// (recordstore.TopicStatus.Unchecked).

// consumerSeenEvery is how often a process records each receiver it sees:
// the status's last-seen times run up to this late.
const consumerSeenEvery = time.Minute

// consumerSeenTimeout bounds one write of a receiver seen.
const consumerSeenTimeout = 10 * time.Second

// processStart is the origin of the monotonic times kept in the slots.
var processStart = time.Now()

// seenSlot is the throttle of one receiver of the topic: a declared
// consumer's, local or remote, or the one of a topic that declares none.
// nil for a name the topic does not declare.
func (t *tracked) seenSlot(consumer string) *atomic.Int64 {
	if len(t.deliveries) == 0 {
		return &t.seenOne
	}
	if i := slices.Index(t.deliveries, consumer); i >= 0 {
		return &t.seen[i]
	}
	return nil
}

// foundRecord reports whether a check answered for the delivery's record,
// whatever the answer: the receiver is deployed and checks this store. A
// check that failed, or a consumer let through untracked, tells nothing.
func foundRecord(o observe.CheckOutcome, err error) bool {
	switch o {
	case observe.CheckUntracked:
		return false
	case observe.CheckRefused:
		return errors.Is(err, recordstore.ErrNotDue) || errors.Is(err, recordstore.ErrLeased)
	}
	return true
}

// sawConsumer records, at most once per consumerSeenEvery and process,
// that consumer checked (or confirmed) a record of the topic, on a store
// that implements [recordstore.ConsumerRecorder]. The common case is one
// atomic load; the write runs in a goroutine of its own, off the handler's
// path, and its failure is logged at Debug only: the next one a minute
// later records the receiver.
func (r *Registry) sawConsumer(t *tracked, slot *atomic.Int64, consumer string, logger watermill.LoggerAdapter) {
	if slot == nil {
		return
	}
	now := int64(time.Since(processStart)) + 1 // 0 is never
	last := slot.Load()
	if last != 0 && now-last < int64(consumerSeenEvery) {
		return
	}
	rr, ok := t.store.(recordstore.ConsumerRecorder)
	if !ok || !slot.CompareAndSwap(last, now) {
		return
	}
	r.background.Spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), consumerSeenTimeout)
		defer cancel()
		if err := rr.SawConsumer(ctx, t.topic, consumer); err != nil {
			logger.Debug("Recording a receiver seen failed; the next check records it", watermill.LogFields{"topic": t.topic, "consumer": consumer, "error": err.Error()})
		}
	})
}
