package sqlstore

import "github.com/wmoutbox/outbox/recordstore"

// Completion says what a store does with a record once it is handled; it
// is [recordstore.Completion], named here for [Config].
type Completion = recordstore.Completion

const (
	// Mark sets processed_at from the database clock and keeps the row.
	Mark = recordstore.Mark
	// Delete removes the row; the table has no processed_at column.
	Delete = recordstore.Delete
)
