package sqlstore

import "fmt"

// maxTableName leaves room for the suffixes of index names within the
// 63-byte identifier limit of PostgreSQL (MySQL allows 64).
const maxTableName = 48

// validateTable accepts only plain ASCII identifiers: a letter or underscore,
// then letters, digits or underscores. Anything else (quotes, dots, spaces,
// unicode) is refused before any SQL is built, so names are safe to quote.
func validateTable(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTable)
	}
	if len(name) > maxTableName {
		return fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalidTable, name, maxTableName)
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
