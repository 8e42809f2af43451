package sqlstore

import "fmt"

// maxIdentifier is the identifier limit of PostgreSQL (63 bytes); MySQL
// allows 64 and SQLite has none.
const maxIdentifier = 63

// maxTableName leaves room, within maxIdentifier, for the longest name the
// store derives from the table: its index names (<table>_abandoned) and its
// consumers table (<table>_consumers).
const maxTableName = 48

// derivedSuffixes are appended to the table name to name the other objects
// of its schema: indexes, the consumers table and its own index and key.
var derivedSuffixes = []string{"_pending", "_abandoned", "_processed", consumersSuffix, "_c_pending", "_c_pkey", "_id_seq"}

// consumersSuffix names the table of per-consumer deliveries.
const consumersSuffix = "_consumers"

// consumersTable is the name of the deliveries table of a record table.
func consumersTable(table string) string { return table + consumersSuffix }

// validateTable accepts only plain ASCII identifiers: a letter or underscore,
// then letters, digits or underscores. Anything else (quotes, dots, spaces,
// unicode) is refused before any SQL is built, so names are safe to quote.
// Every name derived from it must fit the identifier limit too.
func validateTable(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTable)
	}
	if len(name) > maxTableName {
		return fmt.Errorf("%w: %q is longer than %d bytes (the names derived from it, such as %q, must fit the database's %d-byte identifiers)",
			ErrInvalidTable, name, maxTableName, consumersTable(name), maxIdentifier)
	}
	for _, suffix := range derivedSuffixes {
		if len(name)+len(suffix) > maxIdentifier {
			return fmt.Errorf("%w: %q is too long: %q would exceed the database's %d-byte identifiers",
				ErrInvalidTable, name, name+suffix, maxIdentifier)
		}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return fmt.Errorf("%w: %q must match [A-Za-z_][A-Za-z0-9_]*", ErrInvalidTable, name)
		}
	}
	return nil
}
