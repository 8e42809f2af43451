package sqlstore

import (
	"fmt"
	"strings"
)

// maxIdentifier is the identifier limit of PostgreSQL (63 bytes); MySQL
// allows 64 and SQLite has none.
const maxIdentifier = 63

// maxTableName leaves room, within maxIdentifier, for the longest name the
// store derives from the table: its index names (<table>_abandoned), its
// consumers table (<table>_consumers), its declarations table
// (<table>_declared), and the name its seen table had before migration 10
// (<table>_receivers).
const maxTableName = 48

// derivedSuffixes are appended to the table name to name the other objects
// of its schema: indexes, the consumers table and its own index and key,
// the seen table and its key (and the names migration 6 gave them), the
// declarations table and its key, and the keys and index of an inbox table.
var derivedSuffixes = []string{"_pending", "_abandoned", "_processed", "_origin", consumersSuffix, "_c_pending", "_c_pkey", seenSuffix, "_s_pkey",
	receiversSuffix, "_r_pkey", declaredSuffix, "_d_pkey", "_id_seq", "_pkey", "_bkey", "_handled"}

// consumersSuffix names the table of per-consumer deliveries.
const consumersSuffix = "_consumers"

// consumersTable is the name of the deliveries table of a record table.
func consumersTable(table string) string { return table + consumersSuffix }

// seenSuffix names the table of the consumers seen per topic.
const seenSuffix = "_seen"

// seenTable is the name of the seen table of a record table.
func seenTable(table string) string { return table + seenSuffix }

// receiversSuffix is the seen table's suffix as migration 6 creates it;
// migration 10 (9 on MySQL) renames it.
const receiversSuffix = "_receivers"

// declaredSuffix names the table of the consumers each topic's latest
// start declared.
const declaredSuffix = "_declared"

// declaredTable is the name of the declarations table of a record table.
func declaredTable(table string) string { return table + declaredSuffix }

// tableName is a validated table name: a plain identifier, or one qualified
// by a schema (schema.table). The objects the store derives from the table
// (its consumers table, its schema version table) live in the same schema;
// index names are never qualified, since an index lives in its table's
// schema (PostgreSQL) or belongs to its table (MySQL).
type tableName struct {
	schema string // "" when the name is not qualified
	name   string
}

// parseTable validates a table name, "table" or "schema.table", for the
// dialect. Each part must be a plain ASCII identifier, so that it is safe to
// quote and to write in a string literal; a dialect without schemas (SQLite)
// refuses a qualified name.
func parseTable(d *Dialect, full string) (tableName, error) {
	schema, name, qualified := strings.Cut(full, ".")
	if !qualified {
		return tableName{name: full}, validateTable(full)
	}
	if strings.Contains(name, ".") {
		return tableName{}, fmt.Errorf("%w: %q has more than one dot; write table or schema.table", ErrInvalidTable, full)
	}
	if d.schemaExists == "" {
		return tableName{}, fmt.Errorf("%w: %q is qualified by a schema, which %s tables cannot be; write a plain table name", ErrInvalidTable, full, d.Name())
	}
	if err := validateSchema(full, schema); err != nil {
		return tableName{}, err
	}
	if err := validateTable(name); err != nil {
		return tableName{}, fmt.Errorf("table of %q: %w", full, err)
	}
	return tableName{schema: schema, name: name}, nil
}

// validateSchema accepts a plain identifier within the identifier limit.
func validateSchema(full, schema string) error {
	switch {
	case schema == "":
		return fmt.Errorf("%w: %q has an empty schema; write table or schema.table", ErrInvalidTable, full)
	case len(schema) > maxIdentifier:
		return fmt.Errorf("%w: the schema of %q is longer than %d bytes", ErrInvalidTable, full, maxIdentifier)
	case !isIdentifier(schema):
		return fmt.Errorf("%w: the schema of %q must match [A-Za-z_][A-Za-z0-9_]*", ErrInvalidTable, full)
	}
	return nil
}

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
	if !isIdentifier(name) {
		return fmt.Errorf("%w: %q must match [A-Za-z_][A-Za-z0-9_]*", ErrInvalidTable, name)
	}
	// The names of the store's own tables: the version table, which every
	// store of a schema shares, and another store's consumers, seen or
	// declarations table, or the name its migrations give the seen table
	// before they rename it.
	if strings.EqualFold(name, VersionTable) {
		return fmt.Errorf("%w: %q is the name of the stores' schema version table", ErrInvalidTable, name)
	}
	for _, own := range []struct{ suffix, what string }{{consumersSuffix, "consumers"}, {seenSuffix, "seen"}, {receiversSuffix, "seen"}, {declaredSuffix, "declarations"}} {
		if len(name) > len(own.suffix) && strings.EqualFold(name[len(name)-len(own.suffix):], own.suffix) {
			return fmt.Errorf("%w: %q ends in %q, which names the %s table of the store of %q", ErrInvalidTable, name, own.suffix, own.what, name[:len(name)-len(own.suffix)])
		}
	}
	return nil
}

// isIdentifier reports whether s matches [A-Za-z_][A-Za-z0-9_]*.
func isIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

// in returns the quoted name of an object in the table's schema: the
// table's own, its consumers table's or its schema version table's.
func (t tableName) in(d *Dialect, name string) string {
	if t.schema == "" {
		return d.quote(name)
	}
	return d.quote(t.schema) + "." + d.quote(name)
}

// quoted is the table's quoted, qualified name.
func (t tableName) quoted(d *Dialect) string { return t.in(d, t.name) }

// versionTable is the quoted schema version table that holds the table's
// row: the one in the table's schema.
func (t tableName) versionTable(d *Dialect) string { return t.in(d, VersionTable) }
