package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ResubmitAbandoned makes the abandoned record id of a tracked name pending
// again (attempts reset) and sends it through pub, decorated or
// not. The name's store must implement [Resubmitter]. If
// the send fails the record stays pending and replay or the
// [StaleResubmitter] sends it later.
func ResubmitAbandoned(ctx context.Context, reg *Registry, pub message.Publisher, name string, id int64) error {
	out, err := newResender(reg, pub)
	if err != nil {
		return err
	}
	t := reg.lookup(name)
	if t == nil {
		return fmt.Errorf("%w: %q is not a tracked name", ErrInvalidConfig, name)
	}
	rs, ok := t.store.(Resubmitter)
	if !ok {
		return fmt.Errorf("%w: the store of %q cannot resubmit abandoned records", ErrInvalidConfig, name)
	}
	tableID, err := identity(ctx, t)
	if err != nil {
		return err
	}
	rec, err := rs.ResubmitAbandoned(ctx, id)
	if err != nil {
		return fmt.Errorf("outbox: resubmitting record %d of %q: %w", id, name, err)
	}
	return out.send(ctx, t, tableID, []Record{rec})
}
