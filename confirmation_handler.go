package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// ConfirmationHandlerConfig configures [NewConfirmationHandler].
type ConfirmationHandlerConfig struct {
	// Timeout bounds the database work of one confirmation, nacked when it
	// runs out. Defaults to 10 seconds.
	Timeout time.Duration
}

func (c *ConfirmationHandlerConfig) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
}

// Validate reports a configuration error, if any.
func (c ConfirmationHandlerConfig) Validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("%w: Timeout %v is negative", ErrInvalidConfig, c.Timeout)
	}
	return nil
}

// NewConfirmationHandler returns the handler that completes the deliveries
// of remote consumers ([Tracked.RemoteConsumers]) from their confirmations:
// only when the table identity, topic, record id, message UUID and a
// declared remote consumer all match a pending delivery. Anything else is
// acknowledged, counted and logged; a database error nacks it.
// [AddConfirmationHandler] adds it to a router.
func NewConfirmationHandler(reg *Registry, cfg ConfirmationHandlerConfig, logger watermill.LoggerAdapter) (message.NoPublishHandlerFunc, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	c := &confirmer{reg: reg, cfg: cfg, logger: logger}
	return c.handle, nil
}

// AddConfirmationHandler adds to router the handler of [NewConfirmationHandler]
// for each distinct confirmation topic of reg ([Tracked.ConfirmTopic]),
// subscribed through sub, named [ConfirmationHandlerName]+":"+topic. It adds
// nothing when no tracked topic has remote consumers, or tracking is off.
func AddConfirmationHandler(router *message.Router, reg *Registry, sub message.Subscriber, logger watermill.LoggerAdapter) error {
	if router == nil || sub == nil {
		return fmt.Errorf("%w: router and subscriber are required", ErrInvalidConfig)
	}
	h, err := NewConfirmationHandler(reg, ConfirmationHandlerConfig{}, logger)
	if err != nil {
		return err
	}
	for _, topic := range reg.confirmTopics() {
		router.AddConsumerHandler(ConfirmationHandlerName+":"+topic, topic, sub, h)
	}
	return nil
}

// confirmTopics returns each confirmation topic once, sorted.
func (r *Registry) confirmTopics() []string {
	var out []string
	for _, t := range r.entries() {
		if t.confirmTo != "" && !slices.Contains(out, t.confirmTo) {
			out = append(out, t.confirmTo)
		}
	}
	slices.Sort(out)
	return out
}

type confirmer struct {
	reg    *Registry
	cfg    ConfirmationHandlerConfig
	logger watermill.LoggerAdapter
}

func (c *confirmer) handle(msg *message.Message) error {
	conf, err := parseConfirmation(msg.Payload)
	if err != nil {
		c.reject(msg, conf, err.Error())
		return nil
	}
	t := c.reg.lookup(conf.Topic)
	if t == nil {
		// Another sending service's, on a confirmation topic they share.
		c.rejectOthers(msg, conf, "no tracked topic of this service has this name")
		return nil
	}
	if !slices.Contains(t.remote, conf.Consumer) {
		c.reject(msg, conf, "the topic does not declare this remote consumer")
		return nil
	}
	ctx, cancel := context.WithTimeout(msg.Context(), c.cfg.Timeout)
	defer cancel()
	identity, err := t.store.Identity(ctx)
	if err != nil {
		return fmt.Errorf("outbox: reading the table identity of %q for a confirmation: %w", t.topic, err)
	}
	if conf.Store != identity {
		c.rejectOthers(msg, conf, "the confirmation names another table")
		return nil
	}
	// The check matches the record's topic and UUID, which never change,
	// and tells a duplicate from a confirmation that matches nothing; the
	// completion then acts on the delivery it checked.
	d := recordstore.Delivery{ID: conf.ID, Topic: t.topic, Consumer: conf.Consumer, UUID: conf.UUID, Declared: t.deliveries}
	fields := c.fields(msg, conf)
	if conf.HeldID != 0 {
		c.sawConsumer(t, conf)
		return c.held(ctx, msg, t, d, conf, fields)
	}
	err = t.store.CheckPending(ctx, d)
	if err == nil || errors.Is(err, recordstore.ErrNotDue) {
		if conf.Failed != "" {
			c.sawConsumer(t, conf)
			return c.failed(ctx, t, d, conf, fields)
		}
		err = t.store.Complete(ctx, d)
	}
	switch {
	case err == nil:
		c.reg.observer().Completed(t.topic, conf.Consumer)
		c.logger.Trace("Remote consumer confirmed its delivery", fields)
		c.sawConsumer(t, conf)
		if conf.Key != "" && t.ordersRemote() {
			c.confirmedKey(t, conf.Key, conf.ID)
		}
		return nil
	case errors.Is(err, recordstore.ErrNotPending):
		c.reg.observer().DuplicateSkipped(t.topic, conf.Consumer)
		c.logger.Debug("Confirmation of a delivery already complete", fields)
		c.sawConsumer(t, conf)
		return nil
	case errors.Is(err, recordstore.ErrMessageMismatch), errors.Is(err, recordstore.ErrUnknownRecord), errors.Is(err, recordstore.ErrNoDelivery),
		errors.Is(err, recordstore.ErrInvalidValue):
		c.reject(msg, conf, err.Error())
		return nil
	}
	return fmt.Errorf("outbox: completing record %d of %q for remote consumer %q: %w", d.ID, d.Topic, d.Consumer, err)
}

// failed counts a remote consumer's failed handling of a pending delivery,
// as the middleware counts a local one: the registry's MaxAttempts
// abandons it, and its Backoff spaces the resends, on a store that
// implements [recordstore.FailureRecorder]. The delivery stays pending
// otherwise, and the stale resubmitter sends it again. A database error
// nacks the report, so that it comes back.
func (c *confirmer) failed(ctx context.Context, t *tracked, d recordstore.Delivery, conf confirmation, fields watermill.LogFields) error {
	c.reg.observer().Failed(t.topic, conf.Consumer)
	fr, ok := t.store.(recordstore.FailureRecorder)
	if !ok {
		warn(c.logger, "Remote consumer failed to handle a message; the store counts no attempts, so it is sent again as it is", fields.Add(watermill.LogFields{"error": conf.Failed}))
		return nil
	}
	p := c.reg.failures()
	attempts, abandoned, err := fr.RecordFailure(ctx, d, "consumer "+strconv.Quote(conf.Consumer)+" in another service: "+conf.Failed, p.maxAttempts, p.backoff.Delay)
	switch {
	case errors.Is(err, recordstore.ErrNotPending):
		return nil
	case err != nil:
		return fmt.Errorf("outbox: counting the failure of record %d of %q at remote consumer %q: %w", d.ID, d.Topic, d.Consumer, err)
	case abandoned:
		c.reg.observer().Abandoned(t.topic, conf.Consumer)
		c.logger.Error("Remote consumer's delivery abandoned after its last allowed attempt", errors.New(conf.Failed), fields.Add(watermill.LogFields{"attempts": attempts}))
		if conf.Key != "" && t.ordersRemote() && t.skipAbandoned {
			// Its key goes on past it: the next record, held by
			// this one, is sent again.
			c.confirmedKey(t, conf.Key, conf.ID)
		}
	default:
		c.logger.Info("Remote consumer failed to handle a message; it is sent again", fields.Add(watermill.LogFields{"attempts": attempts, "error": conf.Failed}))
	}
	return nil
}

// sawConsumer records the remote consumer of a confirmation that matched
// one of its deliveries as seen: its service runs and confirms. It also
// reports a second receiving service confirming under the same consumer
// name.
func (c *confirmer) sawConsumer(t *tracked, conf confirmation) {
	t.confirmedBy(conf.Consumer)
	c.reg.sawConsumer(t, t.seenSlot(conf.Consumer), conf.Consumer, c.logger)
	if conf.Receiver == "" {
		return
	}
	key := t.topic + "\x00" + conf.Consumer
	first, loaded := c.reg.receivers.LoadOrStore(key, conf.Receiver)
	if !loaded || first == conf.Receiver {
		return
	}
	if _, reported := c.reg.receivers.LoadOrStore(key+"\x00"+conf.Receiver, struct{}{}); reported {
		return
	}
	c.logger.Error("Two receiving services confirm under one consumer name", fmt.Errorf(
		"%w: services with inboxes %q and %q both confirm deliveries of tracked topic %q as consumer %q; each confirmation completes the delivery for both, so one of them may never handle a message. "+
			"Consumer names must be unique across services: give each service's handler its own name and declare both in Tracked.RemoteConsumers",
		ErrInvalidConfig, first, conf.Receiver, t.topic, conf.Consumer), watermill.LogFields{"topic": t.topic, "consumer": conf.Consumer})
}

func (c *confirmer) fields(msg *message.Message, conf confirmation) watermill.LogFields {
	return watermill.LogFields{"confirmation_uuid": msg.UUID, "topic": truncate(conf.Topic, 128), "outbox_id": conf.ID,
		"message_uuid": truncate(conf.UUID, 128), "consumer": truncate(conf.Consumer, 128)}
}

// reject counts and logs a confirmation that completes nothing.
func (c *confirmer) reject(msg *message.Message, conf confirmation, why string) {
	if o, ok := c.reg.observer().(observe.ConfirmationObserver); ok {
		o.ConfirmationRejected(conf.Topic, conf.Consumer)
	}
	warn(c.logger, "Confirmation matches no pending delivery of this service; it completes nothing", c.fields(msg, conf).Add(watermill.LogFields{"reason": truncate(why, 256)}))
}

// rejectOthers counts, and logs at Debug only, a confirmation for another
// table or topic: sending services that share a confirmation topic (the
// default one, say) each receive the others' confirmations, which is
// normal and must not page anyone. A forged one is counted all the same.
func (c *confirmer) rejectOthers(msg *message.Message, conf confirmation, why string) {
	if o, ok := c.reg.observer().(observe.ConfirmationObserver); ok {
		o.ConfirmationRejected(conf.Topic, conf.Consumer)
	}
	c.logger.Debug("Confirmation of another service's record; it completes nothing here", c.fields(msg, conf).Add(watermill.LogFields{"reason": why}))
}

// A confirmation is the message a receiver in another service publishes to
// complete its delivery of a tracked message: its payload is this JSON
// object, and it names the record (the sender's table identity, topic and
// id), the message the receiver handled (its UUID) and the receiver (the
// consumer's handler name). The sender completes the consumer's delivery
// only when all of them match a pending delivery.
//
// A receiver whose handler failed publishes the same object with Failed,
// its error: the sender counts the failure toward its MaxAttempts and
// sends the message again. Receiver names the receiving service (its
// inbox's table identity, "" without one), so that the sender sees two
// services that confirm under one consumer name.
type confirmation struct {
	Store    string `json:"store"`
	Topic    string `json:"topic"`
	ID       int64  `json:"id"`
	UUID     string `json:"uuid"`
	Consumer string `json:"consumer"`
	Failed   string `json:"failed,omitempty"`
	Receiver string `json:"receiver,omitempty"`
	// HeldID, instead of ID and with the message's order key, reports
	// that the receiver holds the message: the earlier message of its key
	// is not in its inbox (remote_order.go). Its id is 0, so that a sender
	// of an earlier version, which knows no HeldID, refuses it rather than
	// completing the delivery.
	HeldID int64 `json:"held_id,omitempty"`
	// Key is the message's order key, in every confirmation of a message
	// that has one: confirming a record of the key, it has the sender send
	// the key's next record that the receiver held.
	Key string `json:"key,omitempty"`
	// to is the topic the confirmation goes to; unexported, so not part
	// of the payload.
	to string
}

// maxFailureText bounds the error text a failure report carries, so that
// the report stays within maxConfirmation.
const maxFailureText = 1024

// maxConfirmation bounds a confirmation's payload: every field is a name
// or an id, and a larger payload is not one.
const maxConfirmation = 4096

// errBadConfirmation is wrapped by the error of a confirmation that cannot
// be read.
var errBadConfirmation = errors.New("outbox: malformed confirmation")

func (c confirmation) marshal() []byte {
	b, _ := json.Marshal(c) // strings and an int64 always marshal
	return b
}

// parseConfirmation reads a confirmation's payload, refusing anything that
// is not one: too large, not the JSON object, a field missing or empty, an
// id that is not positive, text that is not UTF-8.
func parseConfirmation(payload []byte) (confirmation, error) {
	var c confirmation
	if len(payload) > maxConfirmation {
		return c, fmt.Errorf("%w: %d bytes", errBadConfirmation, len(payload))
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return confirmation{}, fmt.Errorf("%w: %v", errBadConfirmation, err)
	}
	switch {
	case c.Store == "", c.Topic == "", c.UUID == "", c.Consumer == "":
		return confirmation{}, fmt.Errorf("%w: store, topic, uuid and consumer are required", errBadConfirmation)
	case c.HeldID < 0, c.HeldID > 0 && (c.ID != 0 || c.Key == "" || c.Failed != ""), len(c.Key) > recordstore.MaxOrderKeyLen:
		return confirmation{}, fmt.Errorf("%w: a held message is named by a positive held_id, id 0, its order key (at most %d bytes) and no failure", errBadConfirmation, recordstore.MaxOrderKeyLen)
	case c.HeldID == 0 && c.ID <= 0:
		return confirmation{}, fmt.Errorf("%w: id %d is not positive", errBadConfirmation, c.ID)
	case !utf8.ValidString(c.Store + c.Topic + c.UUID + c.Consumer + c.Failed + c.Receiver + c.Key):
		return confirmation{}, fmt.Errorf("%w: text is not UTF-8", errBadConfirmation)
	}
	if c.HeldID > 0 {
		c.ID = c.HeldID
	}
	return c, nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
