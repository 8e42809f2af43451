package sqlstore

// Completion says what a store does with a record once it is handled.
type Completion int

const (
	// Mark sets processed_at from the database clock and keeps the row.
	Mark Completion = iota
	// Delete removes the row; the table has no processed_at column.
	Delete
)

// String returns "mark" or "delete".
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
