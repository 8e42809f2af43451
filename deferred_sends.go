package outbox

// Deferred sends: on a topic with an order key and one local consumer, a
// later message of a key whose earlier record is on its way in this
// process is sent only once that record completed here.
//
// A key's messages in one Publish would otherwise follow each other in the
// broker: on a broker that keeps their order, each copy arrives right
// after the earlier one and waits in the handler for that one's completion
// to commit, holding up the subscription meanwhile; on one that reorders
// them (GoChannel sends each on a goroutine of its own), a later copy
// arrives first, waits off the handler's path (ordering.go's park) and is
// sent again: two deliveries for one message. Held in the publisher until
// the earlier record completed here, the later message is sent once, when
// it can run, and the subscription goes on with other keys meanwhile.
//
// A held message whose earlier record did not complete here within
// Check.HeldWait (another instance took its copy, or its handler fails) is
// sent all the same, and then nothing is held until this process sees its
// keyed messages come back out of order (sawReorder), reorderQuiet later
// at the soonest: its receiver side checks and holds it as any copy. Under
// a backlog, a copy takes longer than Check.HeldWait to come: while the
// earlier record's copy is behind the first copies that keep coming, or it
// runs here, or its own message waits here in turn, the message waits on
// (stillComing). Giving up then would send every later message of a busy
// key as a checked copy, each put back and claimed again in the store. The
// records are saved before anything is held, so a crash leaves the held
// messages to the stale resubmitter and the next replay.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// reorderQuiet is how long the publisher holds nothing after a held
// message's earlier record did not complete here in time.
const reorderQuiet = time.Minute

// deferredSends are the messages of one ordered topic that wait, in the
// publisher, for the earlier record of their key to complete here.
type deferredSends struct {
	mu sync.Mutex
	// byBefore holds, per earlier record, the message sent once it
	// completed here.
	byBefore map[int64]*deferredSend
	// off is set once a held message's earlier record did not complete
	// here in time, and cleared when this process sees its keyed messages
	// come back out of order after quietUntil (unix nanoseconds).
	off        atomic.Bool
	quietUntil atomic.Int64
}

type deferredSend struct {
	pub message.Publisher
	msg *message.Message
	// id is the record of msg.
	id    int64
	timer *time.Timer
}

// sawReorder records that a first copy came here before the first copy of
// the earlier record of its key, which came here after it.
func (d *deferredSends) sawReorder() {
	if d.off.Load() && time.Now().UnixNano() >= d.quietUntil.Load() {
		d.off.Store(false)
	}
}

// localConsumer is the topic's one local consumer, whose completions the
// publisher can wait for; false when it has several, or remote ones. A
// topic without declared consumers has the first handler seen receiving
// it, or, before any, the handler without a name of a middleware called
// outside a router.
func (t *tracked) localConsumer() (string, bool) {
	if len(t.remote) > 0 || len(t.consumers) > 1 {
		return "", false
	}
	if len(t.consumers) == 1 {
		return t.consumers[0], true
	}
	if first := t.first.Load(); first != nil {
		return *first, true
	}
	return "", true
}

// onItsWayHere reports whether record id is on its way for consumer in
// this process: published here and not yet delivered, its handler
// running, or its completion not yet committed.
func (t *tracked) onItsWayHere(id int64, consumer string) bool {
	return t.runsHere(id, consumer) || t.firstCopies.Coming(id, consumer)
}

// runsHere reports whether record id's handler runs for consumer in this
// process, or its completion is not yet committed.
func (t *tracked) runsHere(id int64, consumer string) bool {
	if _, ok := t.completing.Load(completingKey{id: id, consumer: consumer}); ok {
		return true
	}
	return t.holds.Runs(heldKey{Consumer: consumer, ID: id})
}

// maxHeldWaits bounds, in Check.HeldWait, how long a message waits in this
// process for the earlier record of its key while that record is still on
// its way here (stillComing).
const maxHeldWaits = 40

// stillComing reports whether a message that waited Check.HeldWait (wait)
// for record id, the earlier record of its key, is to wait for it once
// more, as long as it waited less than maxHeldWaits times that: id runs
// or completes here, its own message waits in this process for the record
// before it, or its first copy is behind the others in the broker's queue
// (first copies keep coming, none of them sent wait after it). Under a
// backlog a copy takes longer than wait to come back; a record that
// another instance took, or whose copy was lost, is not waited for past
// wait. Nothing is waited for once the router drains, or while no sender
// runs (no replay plugin or stale resubmitter: the router is not running),
// so that no wait outlives the router's Close by more than wait.
func (t *tracked) stillComing(reg *Registry, id int64, consumer string, wait, waited time.Duration) bool {
	if waited >= maxHeldWaits*wait || reg.background.Draining.Load() || reg.resends() == nil {
		return false
	}
	if _, ok := t.waiting.Load(id); ok || t.runsHere(id, consumer) {
		return true
	}
	return t.firstCopies.Behind(id, consumer, wait)
}

// sendOrdered sends the messages of a publish to an ordered topic, holding
// each whose earlier record of its key (before, by record id) is on its
// way here, while the topic's messages come back out of order.
func (p *publisher) sendOrdered(t *tracked, msgs []*message.Message, records []recordstore.Record, before map[int64]int64) error {
	consumer, ok := t.localConsumer()
	wait := time.Duration(p.reg.heldWait.Load())
	if !ok || wait <= 0 || t.deferred.off.Load() {
		return sendRecorded(p.pub, p.reg, t, msgs, records)
	}
	nowMsgs := make([]*message.Message, 0, len(msgs))
	nowRecs := make([]recordstore.Record, 0, len(records))
	for i, msg := range msgs {
		if b := before[records[i].ID]; b != 0 && t.onItsWayHere(b, consumer) && t.deferred.hold(p, t, consumer, b, records[i].ID, msg, wait) {
			continue
		}
		nowMsgs, nowRecs = append(nowMsgs, msg), append(nowRecs, records[i])
	}
	if len(nowMsgs) == 0 {
		return nil
	}
	return sendRecorded(p.pub, p.reg, t, nowMsgs, nowRecs)
}

// hold keeps msg, the message of record id, until record before completes
// here for consumer, or wait has passed while before was no longer on its
// way here (stillComing); false when it cannot (before completed
// meanwhile, or another message waits for it already).
func (d *deferredSends) hold(p *publisher, t *tracked, consumer string, before, id int64, msg *message.Message, wait time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byBefore[before] != nil || t.holds.Completed(heldKey{Consumer: consumer, ID: before}) {
		return false
	}
	if d.byBefore == nil {
		d.byBefore = map[int64]*deferredSend{}
	}
	s := &deferredSend{pub: p.pub, msg: msg, id: id}
	d.byBefore[before] = s
	t.waiting.Store(id, struct{}{})
	p.reg.background.Add()
	start := time.Now()
	s.timer = time.AfterFunc(wait, func() {
		if t.stillComing(p.reg, before, consumer, wait, time.Since(start)) {
			d.mu.Lock()
			if d.byBefore[before] == s {
				s.timer.Reset(wait)
			}
			d.mu.Unlock()
			return
		}
		if !d.take(before, s) {
			return
		}
		d.off.Store(true)
		d.quietUntil.Store(time.Now().Add(reorderQuiet).UnixNano())
		p.reg.logger().Debug("A held message's earlier record did not complete here in time; sending it, and holding none for a while",
			watermill.LogFields{"topic": t.topic, "held_by": before, "message_uuid": msg.UUID})
		d.send(p.reg, t, s)
	})
	return true
}

// take removes s, the message held for record before, and reports
// whether it was still there: whoever takes it sends it.
func (d *deferredSends) take(before int64, s *deferredSend) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byBefore[before] != s {
		return false
	}
	delete(d.byBefore, before)
	return true
}

// release sends the message held for record id, which completed here, and
// reports whether there was one.
func (d *deferredSends) release(reg *Registry, t *tracked, id int64) bool {
	d.mu.Lock()
	s := d.byBefore[id]
	delete(d.byBefore, id)
	d.mu.Unlock()
	if s == nil {
		return false
	}
	s.timer.Stop()
	d.send(reg, t, s)
	return true
}

// send publishes a held message; a failure leaves its record pending for
// the stale resubmitter and the next replay.
func (d *deferredSends) send(reg *Registry, t *tracked, s *deferredSend) {
	defer reg.background.Done()
	t.firstCopies.Resent(s.id)
	t.waiting.Delete(s.id)
	if err := s.pub.Publish(t.topic, s.msg); err != nil {
		reg.logger().Error("Sending a message held for the earlier record of its key failed; the stale resubmitter or the next replay sends it", err,
			watermill.LogFields{"topic": t.topic, "message_uuid": s.msg.UUID, "outbox_id": s.msg.Metadata[MetadataID]})
		return
	}
	reg.observer().Published(t.topic, 1)
}
