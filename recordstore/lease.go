package recordstore

import "context"

// Releaser is implemented by a [Store] with a delivery lease: its
// CheckPending claims the pending delivery for a while, recording the
// delivery's [Delivery.Lease] token (and returning [ErrLeased] while another
// delivery holds the claim), so that two copies of a message never run the
// same consumer's handler at the same moment. The middleware calls Release
// after a failed handler, so that the redelivery can claim the record at once
// instead of waiting for the lease to run out. A handler that crashes never
// releases; its lease runs out and the record can be claimed again.
type Releaser interface {
	// Release ends the lease of a pending delivery, only when the lease is
	// still held with d.Lease: a delivery that outlived its lease never
	// releases the claim of the delivery that took the record over.
	// Releasing a delivery that is not leased, leased by another token, or
	// not pending is not an error.
	Release(ctx context.Context, d Delivery) error
}
