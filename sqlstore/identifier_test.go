package sqlstore

import (
	"errors"
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
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"} {
		err := validateTable(bad)
		if !errors.Is(err, ErrInvalidTable) {
			t.Errorf("%q accepted (err %v)", bad, err)
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
	data := templateData{d: Postgres(), table: longest}
	for _, name := range []string{data.ConsumersTable(), data.ConsumersIndex("pending"), data.ConsumersIndex("pkey")} {
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
