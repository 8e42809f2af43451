package sqlstore

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/jmoiron/sqlx"
)

// driverFamilies maps the package of a database/sql driver, and the names
// drivers register under, to the dialect that speaks to its database.
// Drivers not listed here are accepted with any dialect: a wrapped or
// instrumented driver says nothing about the database behind it.
var (
	driverPackages = map[string]string{
		"github.com/jackc/pgx":           "postgres",
		"github.com/lib/pq":              "postgres",
		"github.com/go-sql-driver/mysql": "mysql",
		"modernc.org/sqlite":             "sqlite",
		"github.com/mattn/go-sqlite3":    "sqlite",
		"github.com/ncruces/go-sqlite3":  "sqlite",
	}
	driverNames = map[string]string{
		"pgx": "postgres", "pgx/v5": "postgres", "postgres": "postgres", "postgresql": "postgres",
		"mysql":  "mysql",
		"sqlite": "sqlite", "sqlite3": "sqlite",
	}
)

// driverOf names the driver of a pool, and the dialect it needs ("" when
// the driver is unknown). The driver's Go type decides, since a driver can
// be registered under any name; the name sqlx was given is the fallback.
func driverOf(db *sqlx.DB) (driver, dialect string) {
	if db == nil || db.DB == nil {
		return "", ""
	}
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil {
		pkg := t.PkgPath()
		for prefix, d := range driverPackages {
			if pkg == prefix || strings.HasPrefix(pkg, prefix+"/") {
				return fmt.Sprintf("%s (%T)", db.DriverName(), db.Driver()), d
			}
		}
	}
	return db.DriverName(), driverNames[db.DriverName()]
}

// checkDriver refuses a pool whose driver is for another database than the
// dialect, which would otherwise fail later with an error that does not
// name the mismatch (no such function: pg_advisory_xact_lock).
func checkDriver(d *Dialect, db *sqlx.DB) error {
	driver, want := driverOf(db)
	if want == "" || want == d.Name() {
		return nil
	}
	return fmt.Errorf("%w: the %s dialect does not fit the pool's driver %s, a %s driver; use sqlstore.%s()",
		ErrInvalidConfig, d.Name(), driver, want, constructorOf[want])
}

var constructorOf = map[string]string{"postgres": "Postgres", "mysql": "MySQL", "sqlite": "SQLite"}
