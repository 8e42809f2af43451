package outbox

// The receiver side: what the middleware does with another service's
// tracked message (its record lives in a table this service cannot see).
// It deduplicates it in the consumer's inbox, when the service keeps one,
// and confirms the delivery to the sender, when the message asks.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// receipt is what the middleware puts into the context of another service's
// message while its handler runs, for [InboxTx].
type receipt struct {
	inbox  recordstore.Inbox
	entry  recordstore.InboxEntry
	marked atomic.Bool
	// recent, for a message of an ordered topic, remembers it once
	// recorded, and end ends its run here (remote_order.go).
	recent *recentlyHandled
	end    func()
}

type receiptKey struct{}

// receive handles another service's tracked message for this consumer.
func (m *middleware) receive(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	consumer := message.HandlerNameFromCtx(ctx)
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		topic = msg.Metadata[MetadataTopic]
	}
	c, confirm := m.confirmationOf(msg, topic, consumer)
	if (m.cfg.Inbox == nil || consumer == "") && !confirm {
		m.reg.observer().NotOwned(topic, consumer)
		return h(msg)
	}
	fields := watermill.LogFields{"message_uuid": msg.UUID, "topic": topic, "consumer": consumer,
		"outbox_table": truncate(msg.Metadata[MetadataTable], 128), "outbox_id": truncate(msg.Metadata[MetadataID], 64)}
	var r *receipt
	if m.cfg.Inbox != nil && consumer != "" {
		e := recordstore.InboxEntry{Consumer: consumer, MessageUUID: msg.UUID, Source: msg.Metadata[MetadataTable], RecordID: c.ID}
		if m.cfg.BusinessKey != nil {
			e.BusinessKey = m.cfg.BusinessKey(msg)
		}
		checkCtx, cancel := context.WithTimeout(ctx, m.cfg.Check.Timeout)
		handledAs, err := handledAs(checkCtx, m.cfg.Inbox, e)
		cancel()
		if errors.Is(err, recordstore.ErrInvalidEntry) {
			// No redelivery makes the entry valid (an empty or oversized
			// UUID, consumer or business key): handled, unrecorded.
			m.logger.Error("Another service's message cannot be kept in the inbox; handling it without deduplication", err, fields)
			m.reg.observer().NotOwned(topic, consumer)
			return m.runReceived(h, msg, nil, c, confirm, fields)
		}
		if err != nil {
			m.hold(ctx, m.inbox.Failed())
			return nil, &CheckError{Topic: topic, ID: c.ID, Err: fmt.Errorf("reading the inbox: %w", err)}
		}
		m.inbox.Answered()
		key := msg.Metadata[MetadataOrderKey]
		if len(key) > recordstore.MaxOrderKeyLen {
			// No sender stamps such a key: not ordered.
			key = ""
		}
		// Named in the confirmation, the key lets the sender send at once
		// the key's next message that this consumer held.
		c.Key = key
		if handledAs != nil {
			if key != "" {
				m.recent.add(consumer, msg.UUID)
			}
			m.skipHandled(topic, consumer, e, *handledAs, fields)
			if confirm {
				return nil, m.confirm(ctx, c, fields)
			}
			return nil, nil
		}
		r = &receipt{inbox: m.cfg.Inbox, entry: e}
		if key != "" {
			if after := msg.Metadata[MetadataAfter]; after != "" && msg.Metadata[MetadataReleasedFor] != consumer {
				handled, err := m.afterHandled(ctx, m.cfg.Inbox, consumer, after)
				if err != nil {
					m.hold(ctx, m.inbox.Failed())
					return nil, &CheckError{Topic: topic, ID: c.ID, Err: fmt.Errorf("reading the inbox for the earlier message of the order key: %w", err)}
				}
				if !handled {
					return nil, m.holdReceived(ctx, c, confirm, key, after, fields)
				}
			}
			r.recent, r.end = &m.recent, m.recent.start(consumer, msg.UUID)
		}
	} else if msg.Metadata[MetadataAfter] != "" && consumer != "" {
		if _, done := m.unordered.LoadOrStore(consumer, struct{}{}); !done {
			m.logger.Error("Another service's message is ordered by key, but this consumer keeps no inbox to hold it in order; handling it as it comes",
				fmt.Errorf("%w: MiddlewareConfig.Inbox is not set", ErrInvalidConfig), watermill.LogFields{"topic": topic, "consumer": consumer})
		}
	}
	m.reg.observer().NotOwned(topic, consumer)
	return m.runReceived(h, msg, r, c, confirm, fields)
}

// handledAs is the consumer's entry that makes e a duplicate, nil when it
// has none: through [recordstore.InboxFinder] when the inbox is one, which
// names the entry, and otherwise [recordstore.Inbox.Handled], which only
// says whether there is one.
func handledAs(ctx context.Context, in recordstore.Inbox, e recordstore.InboxEntry) (*recordstore.InboxEntry, error) {
	if f, ok := in.(recordstore.InboxFinder); ok {
		return f.HandledAs(ctx, e)
	}
	handled, err := in.Handled(ctx, e)
	if err != nil || !handled {
		return nil, err
	}
	return &e, nil
}

// skipHandled logs and counts a copy the consumer has handled. A message
// under another UUID with a business key already handled is another
// message asking for an operation done already: that is logged at Info,
// with both UUIDs, and counted apart ([InboxObserver]).
func (m *middleware) skipHandled(topic, consumer string, e, handled recordstore.InboxEntry, fields watermill.LogFields) {
	m.reg.observer().DuplicateSkipped(topic, consumer)
	if e.BusinessKey == "" || handled.MessageUUID == e.MessageUUID {
		m.logger.Debug("Message already handled by this consumer (inbox), acking copy without handling", fields)
		return
	}
	m.logger.Info("Another message with a business key this consumer already handled; acking it without handling", fields.Add(watermill.LogFields{
		"business_key": truncate(e.BusinessKey, 128), "handled_message_uuid": truncate(handled.MessageUUID, 128)}))
	if o, ok := m.reg.observer().(observe.InboxObserver); ok {
		o.BusinessKeyDuplicate(topic, consumer)
	}
}

// runReceived runs the handler of another service's message, then records
// it in the inbox (r, nil without one) and confirms it when asked.
func (m *middleware) runReceived(h message.HandlerFunc, msg *message.Message, r *receipt, c confirmation, confirm bool, fields watermill.LogFields) ([]*message.Message, error) {
	ctx := msg.Context()
	spawned := false
	if r != nil {
		msg.SetContext(context.WithValue(ctx, receiptKey{}, r))
		if r.end != nil {
			defer func() {
				if !spawned {
					r.end()
				}
			}()
		}
	}
	produced, herr, panicked := runHandler(h, msg)
	msg.SetContext(ctx)
	if panicked != nil {
		herr = fmt.Errorf("handler panicked: %v", panicked)
	}
	if herr == nil || IsDrop(herr) {
		herr = m.checkInboxTx(ctx, r, herr, fields)
	}
	if herr != nil && !IsDrop(herr) {
		return produced, m.receiveFailed(ctx, c, confirm, herr, panicked, fields)
	}
	if herr != nil {
		produced = nil
	}
	if len(produced) > 0 {
		// As for a record of this service's: the router publishes what
		// the handler produced after this returns and nacks if that
		// fails, so the inbox and the sender learn of the handling only
		// once the router acks.
		spawned = true
		m.reg.background.Spawn(func() {
			m.receivedOnAck(ctx, msg, r, c, confirm, fields)
			if r != nil && r.end != nil {
				r.end()
			}
		})
		return produced, nil
	}
	m.markReceived(ctx, r, fields)
	if confirm {
		return nil, m.confirm(ctx, c, fields)
	}
	return nil, nil
}

// checkInboxTx makes sure that an entry the handler saved with [InboxTx]
// committed, by reading it back on the inbox's own connection: a handler
// whose transaction rolled back (or never committed) and that returned nil
// did not have its effect, so the message is no more handled than if the
// handler had failed. It returns herr, or the error that the entry is not
// there. A handler that dropped the message has its entry saved by the
// middleware instead.
func (m *middleware) checkInboxTx(ctx context.Context, r *receipt, herr error, fields watermill.LogFields) error {
	if r == nil || !r.marked.Load() {
		return herr
	}
	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Check.Timeout)
	defer cancel()
	found, err := handledAs(checkCtx, r.inbox, r.entry)
	switch {
	case err != nil:
		return fmt.Errorf("%w: reading the inbox entry back failed: %w", ErrInboxTxNotCommitted, err)
	case found != nil:
		return herr
	case herr != nil:
		// Dropped: nothing to commit, the middleware saves the entry.
		r.marked.Store(false)
		return herr
	}
	return fmt.Errorf("%w: the handler returned nil, but the inbox entry it saved with outbox.InboxTx is not in the inbox (the transaction rolled back, or was never committed)", ErrInboxTxNotCommitted)
}

// receiveFailed settles a failed handling of another service's message.
// When the message asks for a confirmation, the failure is reported to the
// sender, which counts it toward its MaxAttempts and sends the message again
// after its confirmation window ([StaleResubmitterConfig.ConfirmWithin]),
// and the copy is acknowledged: no redelivery here could be spaced by the
// sender's backoff, nor stopped once the sender has abandoned the delivery.
// If the report cannot be published, or the message asks for none, the
// failure is returned (a nack), and a panic goes on up as it came.
func (m *middleware) receiveFailed(ctx context.Context, c confirmation, confirm bool, herr error, panicked any, fields watermill.LogFields) error {
	m.reg.observer().Failed(c.Topic, c.Consumer)
	if confirm {
		c.Failed = truncateUTF8(herr.Error(), maxFailureText)
		if m.confirm(ctx, c, fields) == nil {
			f := fields
			if panicked != nil {
				f = fields.Add(watermill.LogFields{"stack": string(debug.Stack())})
			}
			m.logger.Error("Handler failed on another service's message; the failure is reported to its sender, which sends the message again", herr, f)
			return nil
		}
	}
	if panicked != nil {
		panic(panicked)
	}
	return herr
}

// confirmationOf is the confirmation the message asks for, if it asks
// for one and this middleware can publish it.
func (m *middleware) confirmationOf(msg *message.Message, topic, consumer string) (confirmation, bool) {
	c := confirmation{Store: msg.Metadata[MetadataTable], Topic: msg.Metadata[MetadataTopic], UUID: msg.UUID, Consumer: consumer}
	c.ID, _ = parseID(msg.Metadata[MetadataID])
	to := msg.Metadata[MetadataConfirmTo]
	if to == "" || consumer == "" {
		return c, false
	}
	if m.cfg.Confirmations == nil {
		if _, done := m.unconfirmed.LoadOrStore(consumer, struct{}{}); !done {
			m.logger.Error("Another service's message asks for a confirmation, but MiddlewareConfig.Confirmations is not set; "+
				"its sender will resend it until this consumer confirms", errors.New("outbox: no confirmation publisher"),
				watermill.LogFields{"topic": topic, "consumer": consumer, "confirm_to": truncate(to, 128)})
		}
		return c, false
	}
	if c.ID == 0 || c.Store == "" || c.Topic == "" || c.UUID == "" {
		m.logger.Error("Another service's message asks for a confirmation but does not name its record; handling it unconfirmed",
			fmt.Errorf("%w: %s %q", ErrInvalidMetadata, MetadataID, truncate(msg.Metadata[MetadataID], 64)),
			watermill.LogFields{"topic": topic, "consumer": consumer, "message_uuid": msg.UUID})
		return c, false
	}
	c.to = to
	return c, true
}

// confirm publishes the confirmation; its failure nacks the message, so
// that the next copy confirms again.
func (m *middleware) confirm(ctx context.Context, c confirmation, fields watermill.LogFields) error {
	c.Receiver = m.receiverIdentity(ctx)
	out := message.NewMessage(watermill.NewUUID(), c.marshal())
	out.SetContext(ctx)
	if err := m.cfg.Confirmations.Publish(c.to, out); err != nil {
		m.logger.Error("Publishing the confirmation failed; nacking so that the next copy confirms again", err, fields)
		return &ConfirmError{Topic: c.Topic, ID: max(c.ID, c.HeldID), Consumer: c.Consumer, Err: err}
	}
	return nil
}

// identifier is an inbox with a table identity (sqlstore's, outboxtest's).
type identifier interface {
	Identity(ctx context.Context) (string, error)
}

// receiverIdentity is the receiving service's identity in its
// confirmations: its inbox's table identity, read once; "" without an
// inbox that has one, or while it cannot be read.
func (m *middleware) receiverIdentity(ctx context.Context) string {
	if id := m.receiver.Load(); id != nil {
		return *id
	}
	in, ok := m.cfg.Inbox.(identifier)
	if !ok {
		none := ""
		m.receiver.Store(&none)
		return none
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Check.Timeout)
	defer cancel()
	id, err := in.Identity(ctx)
	if err != nil {
		m.logger.Debug("Reading the inbox's identity failed; the confirmation names no receiving service", watermill.LogFields{"error": err.Error()})
		return ""
	}
	m.receiver.Store(&id)
	return id
}

// receivedOnAck records and confirms a handled message once the router has
// published what its handler produced.
func (m *middleware) receivedOnAck(ctx context.Context, msg *message.Message, r *receipt, c confirmation, confirm bool, fields watermill.LogFields) {
	select {
	case <-msg.Acked():
		m.markReceived(ctx, r, fields)
		if confirm {
			// The message is acked already: a failed confirmation is
			// logged by confirm, and the sender's resend brings a copy
			// that confirms again.
			_ = m.confirm(ctx, c, fields)
		}
	case <-msg.Nacked():
	}
}

// markReceived records the handled message in the inbox, unless the
// handler did in its transaction. A failure is logged: the handler's
// outcome stands, and a later copy may run the handler again.
func (m *middleware) markReceived(ctx context.Context, r *receipt, fields watermill.LogFields) {
	if r == nil {
		return
	}
	if r.marked.Load() {
		r.recorded()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Complete.Timeout)
	defer cancel()
	err := r.inbox.MarkHandled(ctx, r.entry)
	switch {
	case err == nil:
		r.recorded()
	case errors.Is(err, recordstore.ErrAlreadyHandled):
		r.recorded()
		m.logger.Debug("Another copy was recorded in the inbox first", fields)
	default:
		m.logger.Error("Recording the message in the inbox failed; a later copy may run the handler again", err, fields)
	}
}

// recorded remembers the message of an ordered topic as in the inbox.
func (r *receipt) recorded() {
	if r.recent != nil {
		r.recent.add(r.entry.Consumer, r.entry.MessageUUID)
	}
}

// InboxTx records msg, another service's message being handled, in the
// consumer's inbox inside the handler's own transaction tx, for handlers
// whose business data lives in the inbox's database: the business writes
// and the inbox entry commit together, and the middleware then records
// nothing itself, so the effect happens once in this database. Call it
// first in the transaction:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	switch err := outbox.InboxTx(ctx, tx, msg); {
//	case errors.Is(err, outbox.ErrAlreadyHandled):
//		return nil, nil // another copy did it: ack, do nothing
//	case err != nil:
//		return nil, err
//	}
//	// ... business writes through tx ...
//	return nil, tx.Commit()
//
// A second copy handled at the same moment waits for tx and then gets
// ErrAlreadyHandled. A handler that returned nil though tx did not commit
// has a failed attempt ([ErrInboxTxNotCommitted]). It returns nil for a
// message the middleware keeps in no inbox.
func InboxTx(ctx context.Context, tx Tx, msg *message.Message) error {
	r, ok := msg.Context().Value(receiptKey{}).(*receipt)
	if !ok {
		return nil
	}
	if err := r.inbox.MarkHandledTx(ctx, tx, r.entry); err != nil {
		return err
	}
	r.marked.Store(true)
	return nil
}
