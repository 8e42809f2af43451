package recordstore

// State is where a record, or one consumer's delivery of it, is in its
// life. sqlstore, outboxtest and storetest use this one type.
type State string

// The states of a record or a delivery.
const (
	// Pending waits for a consumer to complete it.
	Pending State = "pending"
	// Completed was completed by its consumer, or by every declared
	// consumer; a store that deletes completed records no longer holds it.
	Completed State = "completed"
	// Abandoned failed its last allowed attempt.
	Abandoned State = "abandoned"
)

// Completion is what a store does with a record once it is complete.
// sqlstore, outboxtest and storetest use this one type.
type Completion int

const (
	// Delete removes the record and its deliveries: the cheapest
	// completion, and the zero value.
	Delete Completion = iota
	// Mark keeps the record, marked completed, until a cleaner deletes
	// it: the history of completed records, for a dashboard or an
	// operator, at the price of an update per completion.
	Mark
)

// String returns "mark" or "delete", the names a store keeps in its schema
// version table.
func (c Completion) String() string {
	switch c {
	case Mark:
		return "mark"
	case Delete:
		return "delete"
	default:
		return "unknown"
	}
}
