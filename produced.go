package outbox

// Produced messages: what the handler of a tracked message returns for the
// router to publish. Their records are keyed by the delivery that produced
// them, so that a rerun of the handler reuses them, and a failed publish of
// them counts as a failed attempt of that delivery.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
)

// producedKey is the context key of a message the handler of a tracked
// message produced.
type producedKey struct{}

// production is a tracked delivery whose handler produced messages, shared
// by them.
type production struct {
	m   *middleware
	ctx context.Context
	msg *message.Message
	a   *admission
	// counted is set once a failed publish is counted, so that it is
	// counted once whether the decorator or the router's nack reports it.
	counted atomic.Bool
}

// produced is what the context of one produced message carries: the
// delivery, and the message's position among what the handler returned.
type produced struct {
	p   *production
	pos int
}

// errNackedAfterSuccess is the failure counted when the router nacks a
// message whose handler succeeded without the publisher decorator having
// reported why: a publisher without the decorator (or to an untracked
// topic) failed, or a middleware outside the outbox's failed.
var errNackedAfterSuccess = errors.New("the router nacked the message after its handler succeeded; publishing the produced messages failed")

// markProduced puts the delivery and each message's position into the
// context of the messages the handler produced, where the publisher
// decorator finds them.
func (m *middleware) markProduced(ctx context.Context, msg *message.Message, a *admission, msgs []*message.Message) *production {
	p := &production{m: m, ctx: ctx, msg: msg, a: a}
	for i, pm := range msgs {
		if pm != nil {
			pm.SetContext(context.WithValue(pm.Context(), producedKey{}, &produced{p: p, pos: i}))
		}
	}
	return p
}

// producedBy returns what produced msg, nil for a message no tracked
// delivery's handler returned.
func producedBy(msg *message.Message) *produced {
	pr, _ := msg.Context().Value(producedKey{}).(*produced)
	return pr
}

// origin is the [recordstore.Record.Origin] of the produced message's
// record on topic: the table, record and consumer of the delivery that
// produced it, the topic and the position. A key longer than
// [recordstore.MaxOriginLen] keeps the table and record and hashes the
// rest.
func (pr *produced) origin(topic string) string {
	a := pr.p.a
	key := a.identity + "/" + a.idText + "/" + a.d.Consumer + "/" + topic + "/" + strconv.Itoa(pr.pos)
	if len(key) <= recordstore.MaxOriginLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return a.identity + "/" + a.idText + "/sha256:" + hex.EncodeToString(sum[:])
}

// publishFailed counts a failed publish of the produced messages against
// the delivery that produced them, once.
func (p *production) publishFailed(err error) {
	if p.counted.CompareAndSwap(false, true) {
		p.m.publishFailed(p.ctx, p.msg, p.a, err)
	}
}

// producedFailed reports a failed tracked publish of msgs to the
// deliveries that produced them.
func producedFailed(msgs []*message.Message, err error) {
	for _, msg := range msgs {
		if msg == nil {
			continue
		}
		if pr := producedBy(msg); pr != nil {
			pr.p.publishFailed(err)
		}
	}
}

// publishFailed settles a delivery whose handler succeeded but whose
// produced messages were not published: a failed attempt, as a handler
// error is, so that the backoff and MaxAttempts apply. The middleware has
// returned already, so an abandonment is logged (by recordFailure) and
// reported to OnAbandon, and the router's nack brings a copy that is acked
// without running the handler.
func (m *middleware) publishFailed(ctx context.Context, msg *message.Message, a *admission, err error) {
	if m.countFailure(ctx, msg, a, fmt.Errorf("publishing the produced messages: %w", err)) != nil {
		return
	}
	m.release(ctx, a)
}
