package sqlstore

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/wmoutbox/outbox/recordstore"
)

func TestValidateTable(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"watermill_outbox", "_x", "Orders2", "a"} {
		if err := validateTable(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1abc", `a"b`, "a.b", "a b", "ordres_é", "a;drop", "a-b", "a`b", "a'b",
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij", VersionTable, "WATERMILL_OUTBOX_SCHEMA", "orders" + consumersSuffix, "orders" + seenSuffix, "orders" + receiversSuffix} {
		err := validateTable(bad)
		if !errors.Is(err, ErrInvalidTable) {
			t.Errorf("%q accepted (err %v)", bad, err)
		}
	}
}

func TestParseTableWithSchema(t *testing.T) {
	t.Parallel()
	for _, d := range []*Dialect{Postgres(), MySQL()} {
		for full, want := range map[string]tableName{
			"watermill_outbox":          {name: "watermill_outbox"},
			"tenant_a.watermill_outbox": {schema: "tenant_a", name: "watermill_outbox"},
			"_S1.T":                     {schema: "_S1", name: "T"},
			strings.Repeat("s", maxIdentifier) + ".t": {schema: strings.Repeat("s", maxIdentifier), name: "t"},
		} {
			got, err := parseTable(d, full)
			if err != nil || got != want {
				t.Errorf("%s: %q parsed as %+v, %v", d.Name(), full, got, err)
			}
		}
		for _, bad := range []string{"a.b.c", ".t", "s.", ".", "a..b", "s .t", "s. t", `"s".t`, "`s`.t", "s.'t'",
			"1s.t", "s.1t", "s;x.t", "sé.t", "s.t;x", strings.Repeat("s", maxIdentifier+1) + ".t",
			"s." + strings.Repeat("t", maxTableName+1)} {
			if _, err := parseTable(d, bad); !errors.Is(err, ErrInvalidTable) {
				t.Errorf("%s: %q accepted (err %v)", d.Name(), bad, err)
			}
		}
	}
}

func TestSQLiteRefusesASchema(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Dialect: SQLite(), Table: "tenant_a.watermill_outbox"})
	if !errors.Is(err, ErrInvalidTable) || !strings.Contains(err.Error(), "sqlite") || !strings.Contains(err.Error(), "tenant_a.watermill_outbox") {
		t.Errorf("a qualified name on SQLite: %v", err)
	}
	if _, err := New(Config{Dialect: SQLite(), Table: "watermill_outbox"}); err != nil {
		t.Errorf("a plain name on SQLite: %v", err)
	}
}

// TestQualifiedStatementsOnlyQualifyTheTables builds every statement and
// migration for t and for s.t: the only difference is the schema before
// each table (the record table, its consumers table and the schema version
// table). Index and key names stay unqualified but in DROP INDEX, which
// finds the index by its qualified name; and the statements of a
// plain name are those of a table in the connection's own schema.
func TestQualifiedStatementsOnlyQualifyTheTables(t *testing.T) {
	t.Parallel()
	plain, qualified := tableName{name: "t"}, tableName{schema: "s", name: "t"}
	for _, d := range []*Dialect{Postgres(), MySQL()} {
		q := func(name string) string { return d.quote(name) }
		qualify := strings.NewReplacer(
			q("t"), q("s")+"."+q("t"),
			q("t_consumers"), q("s")+"."+q("t_consumers"),
			q("t_receivers"), q("s")+"."+q("t_receivers"),
			q("t_seen"), q("s")+"."+q("t_seen"),
			q("t_declared"), q("s")+"."+q("t_declared"),
			q(VersionTable), q("s")+"."+q(VersionTable),
			"table_schema = DATABASE()", "table_schema = 's'", // MySQL's version table lookup
		)
		for _, mode := range []Completion{Mark, Delete} {
			want, got := statementsOf(t, d, plain, mode), statementsOf(t, d, qualified, mode)
			for name, stmt := range want {
				w := qualify.Replace(stmt)
				dropIndex := strings.HasPrefix(stmt, "DROP INDEX")
				if dropIndex { // an index is dropped by its qualified name
					open := q("t")[:1] + "t_"
					w = strings.Replace(w, open, q("s")+"."+open, 1)
				}
				// ALTER TABLE … RENAME TO takes the new name unqualified.
				w = strings.ReplaceAll(w, "RENAME TO "+q("s")+".", "RENAME TO ")
				if got[name] != w {
					t.Errorf("%s %v %s:\n got %s\nwant %s", d.Name(), mode, name, got[name], w)
				}
				if !dropIndex && strings.Contains(strings.NewReplacer(q("s")+"."+q("t_consumers"), "", q("s")+"."+q("t_receivers"), "", q("s")+"."+q("t_seen"), "", q("s")+"."+q("t_declared"), "").Replace(got[name]), q("s")+"."+q("t_")) {
					t.Errorf("%s %v %s qualifies an index name: %s", d.Name(), mode, name, got[name])
				}
			}
		}
	}
}

// statementsOf returns every statement of a store on table, and of an
// inbox on it, and their rendered migrations, by name.
func statementsOf(t *testing.T, d *Dialect, table tableName, mode Completion) map[string]string {
	t.Helper()
	out := map[string]string{}
	addStatements(out, "", reflect.ValueOf(buildQueries(d, table, mode, false)).Elem())
	iq := buildInboxQueries(d, table)
	addStatements(out, "inbox.", reflect.ValueOf(&iq).Elem())
	for prefix, dir := range map[string]string{"": recordMigrations(d), "inbox.": inboxMigrations(d)} {
		ms, err := loadMigrations(migrationFiles, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			var b strings.Builder
			if err := m.tmpl.Execute(&b, templateData{d: d, table: table, Mark: mode == Mark}); err != nil {
				t.Fatal(err)
			}
			out[prefix+m.name] = b.String()
		}
	}
	return out
}

// addStatements adds the statements held by the fields of v, a struct of
// queries, and of the structs it embeds, named by prefix and field.
func addStatements(out map[string]string, prefix string, v reflect.Value) {
	for i := range v.NumField() {
		f, name := v.Field(i), prefix+v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.String:
			out[name] = f.String()
		case reflect.Map:
			for _, k := range f.MapKeys() {
				out[name+"["+k.String()+"]"] = f.MapIndex(k).String()
			}
		case reflect.Struct:
			addStatements(out, name+".", f)
		}
	}
}

func TestValidateTableLeavesRoomForDerivedNames(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("t", maxTableName)
	if err := validateTable(longest); err != nil {
		t.Fatalf("a %d-byte name is refused: %v", maxTableName, err)
	}
	for _, suffix := range derivedSuffixes {
		if n := len(longest + suffix); n > maxIdentifier {
			t.Errorf("%q is %d bytes, over the %d-byte identifier limit", longest+suffix, n, maxIdentifier)
		}
	}
	data := templateData{d: Postgres(), table: tableName{name: longest}}
	for _, name := range []string{data.ConsumersTable(), data.ConsumersIndex("pending"), data.ConsumersIndex("pkey"), data.SeenTable(), data.SeenIndex("pkey"), data.ReceiversTable(), data.ReceiversIndex("pkey"), data.DeclaredTable(), data.DeclaredIndex("pkey")} {
		if n := len(strings.Trim(name, `"`)); n > maxIdentifier {
			t.Errorf("%s is %d bytes, over the limit", name, n)
		}
	}
	err := validateTable(longest + "t")
	if !errors.Is(err, ErrInvalidTable) || !strings.Contains(err.Error(), consumersTable(longest+"t")) {
		t.Errorf("a name one byte too long: %v", err)
	}
}

func TestNewRefusesBadConfigBeforeSQL(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Dialect: Postgres(), Table: `x"; DROP TABLE y; --`}); !errors.Is(err, ErrInvalidTable) {
		t.Errorf("bad table: %v", err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("missing dialect: %v", err)
	}
	if _, err := New(Config{Dialect: &Dialect{}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero dialect: %v", err)
	}
	if _, err := New(Config{Dialect: SQLite(), Completion: Completion(9)}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad completion: %v", err)
	}
	s, err := New(Config{Dialect: SQLite()})
	if err != nil || s.Table() != DefaultTable {
		t.Errorf("default table: %v %q", err, s.Table())
	}
	if err := s.CheckPending(t.Context(), recordstore.Delivery{ID: 1, Topic: "orders"}); !errors.Is(err, ErrNoDB) {
		t.Errorf("no db attached: %v", err)
	}
}

// TestNewRefusesTheVersionTable: a store on the version table would, on
// MySQL, have its Migrate alter the table every store of the schema shares.
func TestNewRefusesTheVersionTable(t *testing.T) {
	t.Parallel()
	for _, d := range []*Dialect{Postgres(), MySQL(), SQLite()} {
		for _, table := range []string{VersionTable, "app." + VersionTable, "orders_consumers", "orders_declared"} {
			if d.schemaExists == "" && strings.Contains(table, ".") {
				continue
			}
			if _, err := New(Config{Dialect: d, Table: table}); !errors.Is(err, ErrInvalidTable) {
				t.Errorf("%s: %q accepted (err %v)", d.Name(), table, err)
			}
		}
	}
}
