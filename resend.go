package outbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// resender sends saved records again: startup replay, the stale resubmitter
// and the requeue of abandoned records all send through one. It sends
// through the undecorated publisher, so that a record is never saved twice.
type resender struct {
	reg *Registry
	pub message.Publisher
}

// newResender accepts the decorated publisher too: it unwraps it.
func newResender(reg *Registry, pub message.Publisher) (*resender, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	for {
		p, decorated := pub.(*publisher)
		if !decorated {
			break
		}
		pub = p.pub
	}
	return &resender{reg: reg, pub: pub}, nil
}

// identity reads the table identity that resent messages carry, once per
// run of a sender: a failure is a read failure, before anything is sent.
func identity(ctx context.Context, t *tracked) (string, error) {
	id, err := t.store.Identity(ctx)
	if err != nil {
		return "", &ReplayError{Name: t.name, Err: fmt.Errorf("reading the table identity: %w", err)}
	}
	return id, nil
}

// send publishes records of one tracked name with their original id, UUID,
// payload and metadata, and the table's identity. The messages carry a
// context that keeps ctx's values but not its cancellation: a broker that
// hands the message's context to the handler (GoChannel with
// PreserveContext) must not deliver a context that the end of the replay
// cancelled.
func (s *resender) send(ctx context.Context, t *tracked, identity string, recs []Record) error {
	msgCtx := context.WithoutCancel(ctx)
	msgs := make([]*message.Message, len(recs))
	for i, rec := range recs {
		msgs[i] = replayMessage(msgCtx, t.name, identity, rec)
	}
	if err := s.pub.Publish(t.name, msgs...); err != nil {
		return &ReplayError{Name: t.name, ID: recs[0].ID, Err: fmt.Errorf("sending records %d..%d: %w", recs[0].ID, recs[len(recs)-1].ID, err)}
	}
	s.reg.observer().Replayed(t.name, len(recs))
	return nil
}

func replayMessage(ctx context.Context, name, identity string, rec Record) *message.Message {
	md := make(message.Metadata, len(rec.Metadata)+3)
	for k, v := range rec.Metadata {
		md[k] = v
	}
	md[MetadataID] = strconv.FormatInt(rec.ID, 10)
	md[MetadataName] = name
	md[MetadataStore] = identity
	msg := message.NewMessage(rec.UUID, rec.Payload)
	msg.Metadata = md
	msg.SetContext(ctx)
	return msg
}
