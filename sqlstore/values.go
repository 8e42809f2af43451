package sqlstore

// Values the databases cannot keep: what a delivery, an inbox entry or an
// error text holds that its column refuses (a NUL byte or invalid UTF-8 in
// PostgreSQL's text, invalid UTF-8 in MySQL's utf8mb4, a name longer than
// MySQL's VARBINARY column) is refused before any statement is sent, so
// that it never fails a statement that other calls share, nor a caller's
// transaction, and an inbox refuses an entry in Handled already, before
// the handler runs. What slips through (a character that a PostgreSQL
// database in another encoding lacks) comes back as the database's data
// exception, which convertError wraps in recordstore.ErrInvalidValue, and
// a combined statement that one is retried call by call.

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/wmoutbox/outbox/recordstore"
)

// column is what one kind of column keeps; the zero value keeps any bytes.
type column struct {
	// utf8 keeps valid UTF-8 only; noNUL keeps no NUL byte.
	utf8, noNUL bool
	// max is the most bytes kept; 0 for any number.
	max int
}

// refuses says what in v the column cannot keep; "" when it keeps v.
func (c column) refuses(v string) string {
	switch {
	case c.max > 0 && len(v) > c.max:
		return fmt.Sprintf("%d bytes, more than %d", len(v), c.max)
	case c.noNUL && strings.IndexByte(v, 0) >= 0:
		return "a NUL byte"
	case c.utf8 && !utf8.ValidString(v):
		return "bytes that are not UTF-8"
	}
	return ""
}

// text is v as the column keeps it, at most n bytes: what it cannot keep
// is replaced by U+FFFD, and the result cut at a character boundary.
func (c column) text(v string, n int) string {
	if c.utf8 || c.noNUL {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	if c.noNUL {
		v = strings.ReplaceAll(v, "\x00", "\uFFFD")
	}
	return cutUTF8(v, n)
}

// refuses is the error, before any statement is sent, of a delivery with a
// consumer or topic (and, when uuid is set, a message UUID) that the table
// cannot keep: one wrapping [recordstore.ErrInvalidValue]; nil when it
// keeps them. A check need not refuse a UUID: it compares the record's with
// it once read (see claim).
func (s *Store) refuses(op string, d recordstore.Delivery, uuid bool) error {
	fields := [...]struct {
		name, value string
		kind        column
	}{{"consumer", d.Consumer, s.dialect.nameColumn}, {"topic", d.Topic, s.dialect.nameColumn}, {"message UUID", d.UUID, s.dialect.textColumn}}
	for i, f := range fields {
		if i == len(fields)-1 && !uuid {
			break
		}
		if why := f.kind.refuses(f.value); why != "" {
			return &TableError{Table: s.table, Op: op, Err: fmt.Errorf("%w: the %s %.64q has %s", recordstore.ErrInvalidValue, f.name, f.value, why)}
		}
	}
	return nil
}
