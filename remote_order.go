package outbox

// Order across services: how the messages of a topic with an order key
// (Tracked.OrderKey) reach its remote consumers (Tracked.RemoteConsumers)
// in the order they were saved, whatever the broker does with them.
//
// The sender stamps every send of such a message, at the publish and at
// each resend, with its key (MetadataOrderKey) and the UUID of the latest
// earlier record of the key not complete then (MetadataAfter), read in one
// statement per send (recordstore.KeyPredecessorMessages). Every earlier
// record of the key that holds the consumer is that one or before it, and
// the consumer handled those before it (by induction), so the receiver
// asks one thing: is that message in its inbox? It looks in the messages
// this process recorded lately, waits for that message while its handler
// runs here, and otherwise reads its inbox. A broker that keeps order, one
// instance, costs nothing more: the earlier message was handled here just
// before.
//
// A message whose earlier one is not in the inbox is held: acknowledged
// unrun, with a confirmation that says so (confirmation.HeldID). The sender
// checks the delivery as it checks a local one (an ordered CheckPending).
// If an earlier record still holds it, the record is put back
// (KeyClaimer.PutBack), and the completion of a record of its key sends it
// again (remoteClaims), as for a local consumer. If none does (the inbox
// no longer keeps the earlier entry, the earlier record was abandoned and
// the topic skips abandoned records, a duplicate by business key left no
// entry of its own), it is sent again at once, released for that consumer
// (MetadataReleasedFor). The sender's store decides; the receiver keeps no
// state of its own beyond its inbox.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// ordersRemote reports whether t's messages carry their key's earlier
// message for receivers in other services.
func (t *tracked) ordersRemote() bool { return t.orderKey != "" && len(t.remote) > 0 }

// keyOf is a saved record's order key, from its metadata: stores do not
// fill Record.OrderKey in the records they return.
func (t *tracked) keyOf(rec recordstore.Record) string {
	if rec.OrderKey != "" {
		return rec.OrderKey
	}
	k := rec.Metadata[t.orderKey]
	if len(k) > recordstore.MaxOrderKeyLen {
		return ""
	}
	return k
}

// stampAfter stamps the messages of recs (msgs[i] is recs[i]'s) that have
// an order key with it and with their key's earlier message, read from
// the store, and with released when not empty. It returns the earlier
// records by id. A store that cannot tell leaves the messages unstamped,
// and says so once.
func stampAfter(ctx context.Context, reg *Registry, t *tracked, msgs []*message.Message, recs []recordstore.Record, released string) (map[int64]recordstore.Predecessor, error) {
	ids := make([]int64, 0, len(recs))
	for _, r := range recs {
		if t.keyOf(r) != "" {
			ids = append(ids, r.ID)
		}
	}
	return stampAfterOf(ctx, reg, t, msgs, recs, released, nil, ids)
}

// stampSaved is stampAfter for the records one insert has just saved: the
// earlier message of a key that is the batch's own (earlierInBatch) needs
// no read.
func stampSaved(ctx context.Context, reg *Registry, t *tracked, msgs []*message.Message, recs []recordstore.Record) (map[int64]recordstore.Predecessor, error) {
	earlier, ids := earlierInBatch(recs, t.keyOf)
	return stampAfterOf(ctx, reg, t, msgs, recs, "", earlier, ids)
}

// stampAfterOf stamps as stampAfter does, with the earlier record of each
// record of earlier (by id, its index in recs) known, and that of each
// record of ids read from the store.
func stampAfterOf(ctx context.Context, reg *Registry, t *tracked, msgs []*message.Message, recs []recordstore.Record, released string, earlier map[int64]int, ids []int64) (map[int64]recordstore.Predecessor, error) {
	if len(ids) == 0 && len(earlier) == 0 {
		return nil, nil
	}
	kp, ok := t.store.(recordstore.KeyPredecessorMessages)
	if !ok {
		if t.unorderedRemote.CompareAndSwap(false, true) {
			reg.logger().Error("The store cannot name the earlier message of an order key; remote consumers receive the topic unordered",
				fmt.Errorf("%w: the store of tracked topic %q does not implement recordstore.KeyPredecessorMessages", ErrNotSupported, t.topic),
				watermill.LogFields{"topic": t.topic})
		}
		return nil, nil
	}
	before := make(map[int64]recordstore.Predecessor, len(ids)+len(earlier))
	if len(ids) > 0 {
		readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), insertTimeout)
		read, err := kp.PredecessorMessages(readCtx, t.topic, ids, t.skipAbandoned)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading the earlier messages of their keys: %w", err)
		}
		maps.Copy(before, read)
	}
	for id, i := range earlier {
		before[id] = recordstore.Predecessor{ID: recs[i].ID, UUID: recs[i].UUID}
	}
	for i, r := range recs {
		k := t.keyOf(r)
		if k == "" {
			continue
		}
		md := msgs[i].Metadata
		md[MetadataOrderKey] = k
		if p := before[r.ID]; p.UUID != "" {
			md[MetadataAfter] = p.UUID
		}
		if released != "" {
			md[MetadataReleasedFor] = released
		}
	}
	return before, nil
}

// sendStamped sends the messages of a publish (or of a transactional
// publish, once committed) to an ordered topic with remote consumers once
// stamped. When the earlier messages cannot be read, the keyed messages are
// not sent (an unstamped one could overtake an earlier message at its
// receiver): their records stay pending, for the stale resubmitter and the
// next replay to send stamped. With firstCopies, the records are
// remembered as the decorated publisher remembers them (first_copy.go).
func sendStamped(ctx context.Context, pub message.Publisher, reg *Registry, t *tracked, msgs []*message.Message, records []recordstore.Record, firstCopies bool) error {
	before, err := stampSaved(ctx, reg, t, msgs, records)
	if err != nil {
		reg.logger().Error("The messages of order keys are left to the stale resubmitter", err, watermill.LogFields{"topic": t.topic, "records": len(records)})
		var nowMsgs []*message.Message
		var nowRecs []recordstore.Record
		for i := range records {
			if t.keyOf(records[i]) == "" {
				nowMsgs, nowRecs = append(nowMsgs, msgs[i]), append(nowRecs, records[i])
			}
		}
		if len(nowMsgs) == 0 {
			return nil
		}
		return sendRecorded(pub, reg, t, nowMsgs, nowRecs)
	}
	// Remembered when each record's earlier one is known: read, or none
	// has a key.
	known := before != nil || !slices.ContainsFunc(records, func(r recordstore.Record) bool { return t.keyOf(r) != "" })
	if firstCopies && known && t.firstCopies.On.Load() && t.completedBy == ByConsumers && t.receivedHere() {
		ids := make(map[int64]int64, len(records))
		for _, r := range records {
			ids[r.ID] = before[r.ID].ID
		}
		t.firstCopies.Saved(records, ids)
	}
	return sendRecorded(pub, reg, t, msgs, records)
}

// The receiver's side.

// recentLimit bounds the messages of ordered topics a middleware remembers
// as recorded in its inbox.
const recentLimit = 1 << 14

// recentlyHandled are the messages of ordered topics (consumer and UUID)
// this process recorded in the inbox lately, and those whose handling
// runs here, so that the next message of a key needs no read of the inbox
// when the broker brings it right after.
type recentlyHandled struct {
	mu      sync.Mutex
	handled map[string]struct{}
	ring    []string
	next    int
	running map[string]chan struct{}
}

func recentKey(consumer, uuid string) string { return consumer + "\x00" + uuid }

func (r *recentlyHandled) has(consumer, uuid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.handled[recentKey(consumer, uuid)]
	return ok
}

// add remembers a message recorded in the inbox, forgetting the oldest
// beyond recentLimit.
func (r *recentlyHandled) add(consumer, uuid string) {
	k := recentKey(consumer, uuid)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.handled == nil {
		r.handled = make(map[string]struct{})
		r.ring = make([]string, recentLimit)
	}
	if _, ok := r.handled[k]; ok {
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.handled, old)
	}
	r.ring[r.next] = k
	r.next = (r.next + 1) % recentLimit
	r.handled[k] = struct{}{}
}

// start records that a message's handling runs here; the returned function
// ends it. A second copy running at once is not recorded again.
func (r *recentlyHandled) start(consumer, uuid string) (end func()) {
	k := recentKey(consumer, uuid)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = make(map[string]chan struct{})
	}
	if _, ok := r.running[k]; ok {
		return func() {}
	}
	done := make(chan struct{})
	r.running[k] = done
	return sync.OnceFunc(func() {
		r.mu.Lock()
		delete(r.running, k)
		r.mu.Unlock()
		close(done)
	})
}

// runningHere is the channel closed when the message's handling here ends;
// nil when it does not run here.
func (r *recentlyHandled) runningHere(consumer, uuid string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[recentKey(consumer, uuid)]
}

// afterHandled reports whether the consumer has the earlier message after
// in its inbox: recorded here lately, recorded once its handling here
// ended (waited for up to Check.HeldWait), or found in the inbox.
func (m *middleware) afterHandled(ctx context.Context, in recordstore.Inbox, consumer, after string) (bool, error) {
	if m.recent.has(consumer, after) {
		return true, nil
	}
	if done := m.recent.runningHere(consumer, after); done != nil {
		wait := time.NewTimer(m.cfg.Check.HeldWait)
		select {
		case <-done:
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
		if m.recent.has(consumer, after) {
			return true, nil
		}
	}
	checkCtx, cancel := context.WithTimeout(ctx, m.cfg.Check.Timeout)
	defer cancel()
	handled, err := in.Handled(checkCtx, recordstore.InboxEntry{Consumer: consumer, MessageUUID: after})
	if errors.Is(err, recordstore.ErrInvalidEntry) {
		// No inbox holds such a UUID: held, for the sender to decide.
		return false, nil
	}
	return handled, err
}

// holdReceived acknowledges, unrun, another service's message whose
// earlier message of its key the consumer has not handled, and tells its
// sender, which sends it again once it can run. Without a confirmation to
// publish it waits Check.HeldWait and is nacked, for the broker to bring
// it back.
func (m *middleware) holdReceived(ctx context.Context, c confirmation, confirm bool, key, after string, fields watermill.LogFields) error {
	fields = fields.Add(watermill.LogFields{"after_message_uuid": truncate(after, 128)})
	if confirm {
		c.HeldID, c.ID, c.Key = c.ID, 0, key
		if err := m.confirm(ctx, c, fields); err != nil {
			return err
		}
		m.logger.Debug("The earlier message of its order key is not in the inbox; holding the message, its sender sends it again", fields)
		return nil
	}
	m.logger.Debug("The earlier message of its order key is not in the inbox; nacking the message", fields)
	m.hold(ctx, m.cfg.Check.HeldWait)
	return &CheckError{Topic: c.Topic, ID: c.ID, Err: fmt.Errorf("%w: the earlier message %q of its order key is not in the inbox", recordstore.ErrHeld, truncate(after, 128))}
}

// The sender's side.

// held acts on a remote consumer's report that it holds a delivery of an
// ordered topic: checked as a local delivery is, it is put back while an
// earlier record holds it, and sent again, released for the consumer, when
// none does.
func (c *confirmer) held(ctx context.Context, msg *message.Message, t *tracked, d recordstore.Delivery, conf confirmation, fields watermill.LogFields) error {
	claimer, ok := t.store.(recordstore.KeyClaimer)
	if !ok || t.orderKey == "" {
		warn(c.logger, "A remote consumer holds a message of a topic this service does not order by key; it is sent again by the stale resubmitter", fields)
		return nil
	}
	d.Ordered, d.SkipAbandoned = true, t.skipAbandoned
	err := t.store.CheckPending(ctx, d)
	var h *recordstore.HeldError
	if errors.As(err, &h) && h.Abandoned {
		// Not put back: held until the abandoned record is requeued and
		// completes, the record is sent again by the stale resubmitter,
		// spaced as a lost copy is.
		c.logger.Debug("Remote consumer holds a message an abandoned record of its key holds", fields.Add(watermill.LogFields{"held_by": h.Before}))
		return nil
	}
	if errors.As(err, &h) {
		if err := claimer.PutBack(ctx, t.topic, d.ID); err != nil {
			return fmt.Errorf("outbox: putting back record %d of %q held by remote consumer %q: %w", d.ID, d.Topic, d.Consumer, err)
		}
		// The earlier record may have completed between the check and the
		// put back, before its completion could see this one put back.
		err = t.store.CheckPending(ctx, d)
		if errors.As(err, &h) {
			c.logger.Debug("Remote consumer holds a message an earlier record of its key holds; it is sent again once that one completes",
				fields.Add(watermill.LogFields{"held_by": h.Before, "held_by_abandoned": h.Abandoned}))
			return nil
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, recordstore.ErrNotDue), errors.Is(err, recordstore.ErrNotPending), errors.Is(err, recordstore.ErrLeased):
		// Sent again when due, or complete already.
		return nil
	case errors.Is(err, recordstore.ErrMessageMismatch), errors.Is(err, recordstore.ErrUnknownRecord), errors.Is(err, recordstore.ErrNoDelivery),
		errors.Is(err, recordstore.ErrInvalidValue):
		c.reject(msg, conf, err.Error())
		return nil
	default:
		return fmt.Errorf("outbox: checking record %d of %q held by remote consumer %q: %w", d.ID, d.Topic, d.Consumer, err)
	}
	c.release(ctx, t, claimer, d, conf, fields)
	return nil
}

// release sends record d.ID again, released for d's consumer: no earlier
// record of its key holds that consumer's delivery. The claim is of the
// head of conf.Key after d.ID-1; only d's own record, with that key, is
// sent released.
func (c *confirmer) release(ctx context.Context, t *tracked, claimer recordstore.KeyClaimer, d recordstore.Delivery, conf confirmation, fields watermill.LogFields) {
	res := c.reg.resends()
	if res == nil || conf.Key == "" {
		return
	}
	recs, err := claimer.ClaimKey(ctx, t.topic, conf.Key, d.ID-1, time.Microsecond)
	if err != nil || len(recs) == 0 {
		if err != nil {
			c.logger.Error("Claiming a held message to send it again failed; the stale resubmitter sends it", err, fields)
		}
		return
	}
	released := ""
	if recs[0].ID == d.ID && t.keyOf(recs[0]) == conf.Key {
		released = d.Consumer
	}
	identity, err := t.store.Identity(ctx)
	if err == nil {
		err = res.sendFor(ctx, t, identity, recs, released)
	}
	if err != nil {
		c.logger.Error("Sending a held message again failed; the stale resubmitter sends it", err, fields)
		return
	}
	c.logger.Debug("Remote consumer held a message no earlier record holds any more; sent it again", fields)
}

// remoteClaims gathers the keys of an ordered topic whose records remote
// consumers confirmed within a short wait, so that one statement
// (recordstore.KeyWaiters) finds those whose next record was put back by
// a held copy, and only theirs are claimed.
type remoteClaims struct {
	mu       sync.Mutex
	last     map[string]int64
	flushing bool
}

// remoteClaimWait is how long confirmations are gathered before their keys
// are looked at.
const remoteClaimWait = 5 * time.Millisecond

// putBackOnly is the send age past which a confirmation claims the key's
// next record: only records put back (their last send moved far into the
// past) or that the stale resubmitter would have sent long ago. Unlike a
// local consumer's, a remote consumer's copy may wait at the broker behind
// a backlog for longer than Check.HeldWait: it is not lost, and sending it
// again doubled the sends of an ordered topic on RabbitMQ. Lost copies are
// the stale resubmitter's (ConfirmWithin).
const putBackOnly = 24 * time.Hour

// confirmedKey counts a remote consumer's confirmation of record id of key
// in the next batch of claims.
func (c *confirmer) confirmedKey(t *tracked, key string, id int64) {
	rc := &t.remoteClaims
	rc.mu.Lock()
	if rc.last == nil {
		rc.last = map[string]int64{}
	}
	rc.last[key] = max(rc.last[key], id)
	start := !rc.flushing
	rc.flushing = true
	rc.mu.Unlock()
	if start {
		c.reg.background.Spawn(func() { c.claimBatch(t) })
	}
}

// claimBatch claims and sends the next record of each key of the batch
// that has one waiting.
func (c *confirmer) claimBatch(t *tracked) {
	<-time.After(remoteClaimWait)
	rc := &t.remoteClaims
	rc.mu.Lock()
	batch := rc.last
	rc.last, rc.flushing = nil, false
	rc.mu.Unlock()
	res := c.reg.resends()
	claimer, ok := t.store.(recordstore.KeyClaimer)
	if res == nil || !ok || len(batch) == 0 {
		return
	}
	wait := putBackOnly
	keys := make([]string, 0, len(batch))
	for k := range batch {
		keys = append(keys, k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	if kw, ok := t.store.(recordstore.KeyWaiters); ok {
		waiting, err := kw.WaitingKeys(ctx, t.topic, keys, wait)
		if err != nil {
			c.logger.Error("Reading which order keys wait for a send failed; the stale resubmitter sends them", err, watermill.LogFields{"topic": t.topic, "keys": len(keys)})
			return
		}
		keys = waiting
	}
	for _, k := range keys {
		recs, err := claimer.ClaimKey(ctx, t.topic, k, batch[k], wait)
		if err == nil && len(recs) > 0 {
			var identity string
			if identity, err = t.store.Identity(ctx); err == nil {
				err = res.send(ctx, t, identity, recs)
			}
		}
		if err != nil {
			c.logger.Error("Sending the next record of an order key again failed; the stale resubmitter sends it", err, watermill.LogFields{"topic": t.topic})
		}
	}
}
