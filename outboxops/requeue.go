package outboxops

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/hooks"
)

// Requeue makes the abandoned record id of a tracked topic pending again
// (the attempts of its abandoned deliveries reset; deliveries other
// consumers completed stay complete) and sends it through pub, decorated or
// not. The topic's store must implement [recordstore.Requeuer]. If the send
// fails the record stays pending, and replay or the
// [outbox.StaleResubmitter] sends it later.
func Requeue(ctx context.Context, reg *outbox.Registry, pub message.Publisher, topic string, id int64) error {
	if reg == nil {
		return fmt.Errorf("%w: registry is nil", outbox.ErrInvalidConfig)
	}
	return hooks.Requeue(ctx, reg, pub, topic, id)
}
