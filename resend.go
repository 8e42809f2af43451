package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/hooks"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/recordstore"
)

// resender sends saved records again: startup replay, the stale resubmitter
// and the requeue of abandoned records all send through one. It sends
// through the undecorated publisher, so that a record is never saved twice.
type resender struct {
	reg  *Registry
	pub  message.Publisher
	kind observe.ResendKind
}

// newResender accepts the decorated publisher too: it unwraps it.
func newResender(reg *Registry, pub message.Publisher, kind observe.ResendKind) (*resender, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	return &resender{reg: reg, pub: undecorated(pub), kind: kind}, nil
}

// resends is the sender of the records of order keys: the one of the
// stale resubmitter that started running last of those that run; nil when
// none runs.
func (r *Registry) resends() *resender { return r.res.Load() }

// running records s as a running stale resubmitter's sender until the
// returned function is called.
func (r *Registry) running(s *resender) (stop func()) {
	r.resMu.Lock()
	r.senders = append(r.senders, s)
	r.res.Store(s)
	r.resMu.Unlock()
	return func() {
		r.resMu.Lock()
		defer r.resMu.Unlock()
		r.senders = slices.DeleteFunc(r.senders, func(o *resender) bool { return o == s })
		if n := len(r.senders); n > 0 {
			r.res.Store(r.senders[n-1])
		} else {
			r.res.Store(nil)
		}
	}
}

// maxWrappers bounds the walk down a chain of publisher wrappers, so that
// a wrapper that unwraps to itself cannot hang it.
const maxWrappers = 32

// undecorated returns the publisher under the outbox's own decorator in
// pub's chain of wrappers (each exposing Unwrap() message.Publisher, as the
// decorator does), so that a resend never saves its record again, whatever
// wraps the decorated publisher; pub itself when no decorator is in the
// chain. What lies under the decorator (a tracing decorator, say) stays.
func undecorated(pub message.Publisher) message.Publisher {
	out := pub
	p := pub
	for range maxWrappers {
		if d, ok := p.(*publisher); ok {
			out, p = d.pub, d.pub
			continue
		}
		u, ok := p.(interface{ Unwrap() message.Publisher })
		if !ok {
			break
		}
		if p = u.Unwrap(); p == nil {
			break
		}
	}
	return out
}

// identity reads the table identity that resent messages carry, once per
// run of a sender: a failure is a read failure, before anything is sent.
// identityWithin is identity within timeout d.
func identityWithin(ctx context.Context, d time.Duration, t *tracked) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return identity(ctx, t)
}

func identity(ctx context.Context, t *tracked) (string, error) {
	id, err := t.store.Identity(ctx)
	if err != nil {
		return "", &ResendError{Topic: t.topic, Err: fmt.Errorf("reading the table identity: %w", err)}
	}
	return id, nil
}

// send publishes records of one tracked topic with their original id, UUID,
// payload and metadata, and the table's identity. The messages carry a
// context that keeps ctx's values but not its cancellation: a broker that
// hands the message's context to the handler (GoChannel with
// PreserveContext) must not deliver a context that the end of the replay
// cancelled.
func (s *resender) send(ctx context.Context, t *tracked, identity string, recs []recordstore.Record) error {
	return s.sendFor(ctx, t, identity, recs, "")
}

// sendFor is send; on a topic ordered for remote consumers, the messages
// are stamped with their key's earlier message first, and released for
// the remote consumer released when not empty.
func (s *resender) sendFor(ctx context.Context, t *tracked, identity string, recs []recordstore.Record, released string) error {
	msgCtx := context.WithoutCancel(ctx)
	msgs := make([]*message.Message, len(recs))
	for i, rec := range recs {
		msgs[i] = replayMessage(msgCtx, t, identity, rec)
	}
	if t.ordersRemote() {
		if _, err := stampAfter(ctx, s.reg, t, msgs, recs, released); err != nil {
			return &ResendError{Topic: t.topic, ID: recs[0].ID, Err: err}
		}
	}
	if err := s.sendCopies(t, msgs...); err != nil {
		return &ResendError{Topic: t.topic, ID: recs[0].ID, Err: fmt.Errorf("sending records %d..%d: %w", recs[0].ID, recs[len(recs)-1].ID, err)}
	}
	if t.completedBy == OnSend {
		completeSent(msgCtx, s.reg, t, recs)
	}
	return nil
}

// sendClaimed walks t's records by id, claiming a page at a time with claim
// (each bounded by timeout) from a cursor, so that each record is claimed
// once per walk whatever its age, and sends each page's records (those that
// keep returns, when set) with their table identity; it stops at a claim
// that says no more follow, and returns how many it sent. A failed claim is
// a [*ResendError] claiming what.
func (s *resender) sendClaimed(ctx context.Context, t *tracked, identity string, timeout time.Duration, what string,
	claim func(ctx context.Context, after int64) ([]recordstore.Record, bool, error), keep func([]recordstore.Record) []recordstore.Record) (int, error) {
	var after int64
	sent := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		recs, more, err := claim(cctx, after)
		cancel()
		if err != nil {
			return sent, &ResendError{Topic: t.topic, Err: fmt.Errorf("claiming %s: %w", what, err)}
		}
		if len(recs) > 0 {
			after = recs[len(recs)-1].ID
			if keep != nil {
				recs = keep(recs)
			}
			if len(recs) > 0 {
				if err := s.send(ctx, t, identity, recs); err != nil {
					return sent, err
				}
				sent += len(recs)
			}
		}
		if !more {
			return sent, nil
		}
	}
}

// sendCopies publishes messages that carry their records' outbox keys
// already, traced and counted as resent.
func (s *resender) sendCopies(t *tracked, msgs ...*message.Message) error {
	var end func(error)
	if tr := s.reg.tracer(); tr != nil {
		end = tr.TraceResend(s.kind, t.topic, msgs)
	}
	err := s.pub.Publish(t.topic, msgs...)
	endStep(end, err)
	if err != nil {
		return err
	}
	s.reg.observer().Resent(t.topic, s.kind, len(msgs))
	return nil
}

func replayMessage(ctx context.Context, t *tracked, identity string, rec recordstore.Record) *message.Message {
	md := make(message.Metadata, len(rec.Metadata)+4)
	for k, v := range rec.Metadata {
		md[k] = v
	}
	stampKeys(md, t, identity, rec.ID)
	msg := message.NewMessage(rec.UUID, rec.Payload)
	msg.Metadata = md
	msg.SetContext(ctx)
	return msg
}

func init() {
	hooks.Requeue = func(ctx context.Context, reg any, pub message.Publisher, topic string, id int64) error {
		return requeue(ctx, reg.(*Registry), pub, topic, id)
	}
}

// requeue is outboxops.Requeue: it makes the abandoned record id of a
// tracked topic pending again and sends it through pub, decorated or not;
// a failed send leaves it pending for replay or the stale resubmitter.
func requeue(ctx context.Context, reg *Registry, pub message.Publisher, topic string, id int64) error {
	out, err := newResender(reg, pub, observe.ResendRequeue)
	if err != nil {
		return err
	}
	t := reg.lookup(topic)
	if t == nil {
		return fmt.Errorf("%w: %q is not a tracked topic", ErrInvalidConfig, topic)
	}
	rq, ok := t.store.(recordstore.Requeuer)
	if !ok {
		return fmt.Errorf("%w: the store of %q cannot requeue abandoned records", ErrInvalidConfig, topic)
	}
	tableID, err := identity(ctx, t)
	if err != nil {
		return err
	}
	rec, err := rq.Requeue(ctx, id)
	if err != nil {
		return fmt.Errorf("outbox: requeueing record %d of %q: %w", id, topic, err)
	}
	return out.send(ctx, t, tableID, []recordstore.Record{rec})
}

// completeSentTimeout bounds the completions of a topic that completes on
// send; the send already succeeded, so a completion that cannot finish
// leaves the record pending and it is sent again.
const completeSentTimeout = 10 * time.Second

// completeSent completes the records of a topic that completes on send,
// once the wrapped publisher accepted them. The completions run side by
// side, so that a store that combines concurrent completions sends one
// statement for the batch. A failure is logged and leaves the record
// pending, to be sent again: a duplicate, never a loss.
func completeSent(ctx context.Context, reg *Registry, t *tracked, records []recordstore.Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeSentTimeout)
	defer cancel()
	complete := func(rec recordstore.Record) {
		err := t.store.Complete(ctx, recordstore.Delivery{ID: rec.ID, Topic: t.topic, UUID: rec.UUID})
		switch {
		case err == nil:
			reg.observer().Completed(t.topic, "")
		case errors.Is(err, recordstore.ErrNotPending):
			// Sent twice (a replay beside the first send): complete already.
		default:
			reg.logger().Error("Completing a record on send failed; it stays pending and is sent again", err,
				watermill.LogFields{"topic": t.topic, "outbox_id": rec.ID, "message_uuid": rec.UUID})
		}
	}
	if len(records) == 1 {
		complete(records[0])
		return
	}
	var wg sync.WaitGroup
	for _, rec := range records {
		wg.Go(func() { complete(rec) })
	}
	wg.Wait()
}
