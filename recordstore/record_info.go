package recordstore

import "time"

// RecordInfo is a record as a store saved it, with its bookkeeping: what
// sqlstore's Operator reads for operators' tools, and what outboxtest's
// Store keeps of every record it saved. A field a store does not keep is
// zero, as its comment says.
type RecordInfo struct {
	// Record is the record as saved, with the consumers it declared.
	Record
	State     State
	Attempts  int
	LastError string
	// Age is the time since the record was saved; SinceSent the time since
	// it was last sent (by the publish that saved it, or a resend), 0 when
	// the record is Due. By the database clock; zero in outboxtest.
	Age       time.Duration
	SinceSent time.Duration
	// Resent reports whether the record was sent again after the publish
	// that saved it, by a stale resubmit round or a startup replay. When
	// it was not, SinceSent is Age. False in outboxtest.
	Resent bool
	// Due reports that the record was made due (sqlstore's
	// Operator.MakeDue or RequeueLater) and not sent since: the service's
	// next stale resubmit round sends it. False in outboxtest.
	Due bool
	// CompletedBy is the handler that completed a record without declared
	// consumers; "" otherwise, and always in sqlstore.
	CompletedBy string
	// Deliveries are the per-consumer deliveries of a record saved with
	// consumers, in consumer order; nil for a record with one receiver.
	Deliveries []DeliveryInfo
	// Gone is true when the store no longer holds the record: it deleted
	// it on completion (outboxtest.StoreConfig.DeleteCompleted) or cleaned
	// it. Only outboxtest, which remembers every record it saved, sets it.
	Gone bool
}

// DeliveryInfo is one consumer's delivery of a record.
type DeliveryInfo struct {
	Consumer  string
	State     State
	Attempts  int
	LastError string
}
