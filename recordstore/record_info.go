package recordstore

import "time"

// RecordInfo is a record with its bookkeeping, as operators see it. Ages
// are by the database clock.
type RecordInfo struct {
	Record
	State     State
	Attempts  int
	LastError string
	// Age is the time since the record was saved; SinceSent the time since
	// it was last sent (by the publish that saved it, or a resend), 0 when
	// the record is Due.
	Age       time.Duration
	SinceSent time.Duration
	// Resent reports whether the record was sent again after the publish
	// that saved it, by a stale resubmit round or a startup replay. When
	// it was not, SinceSent is Age.
	Resent bool
	// Due reports that the record was made due (sqlstore's
	// Operator.MakeDue or RequeueLater) and not sent since: the service's
	// next stale resubmit round sends it.
	Due bool
	// Deliveries are the per-consumer deliveries of a record saved with
	// consumers, in consumer order; nil for a record with one receiver.
	Deliveries []DeliveryInfo
}

// DeliveryInfo is one consumer's delivery of a record, as operators see it.
type DeliveryInfo struct {
	Consumer  string
	State     State
	Attempts  int
	LastError string
}
