package outbox

import "context"

// Releaser is implemented by a [Store] with a delivery lease: its
// CheckPending claims the pending record for a while (returning [ErrLeased]
// while another delivery holds the claim), so that two copies of a message
// never run the handler at the same moment. The middleware calls Release
// after a failed handler, so that the redelivery can claim the record at once
// instead of waiting for the lease to run out. A handler that crashes never
// releases; its lease runs out and the record can be claimed again.
type Releaser interface {
	// Release ends the lease of a pending record. Releasing a record that
	// is not leased, or not pending, is not an error.
	Release(ctx context.Context, id int64) error
}
