package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox/sqlstore"
)

// A tool that inspects a table it did not configure opens it with
// OpenTable, which reads the completion mode the table was created with.
func ExampleOpenTable() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(dir, "outbox.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	// The service created its table as a deleting one.
	service, err := sqlstore.New(sqlstore.Config{Dialect: sqlstore.SQLite(), Table: "orders_outbox", Completion: sqlstore.Delete, DB: db})
	if err != nil {
		panic(err)
	}
	if err := service.Migrate(ctx); err != nil {
		panic(err)
	}

	store, err := sqlstore.OpenTable(ctx, db, sqlstore.SQLite(), "orders_outbox")
	if err != nil {
		panic(err)
	}
	fmt.Println(store.Table(), store.Completion())

	_, err = sqlstore.OpenTable(ctx, db, sqlstore.SQLite(), "no_such_table")
	fmt.Println(errors.Is(err, sqlstore.ErrTableMissing))
	// Output:
	// orders_outbox delete
	// true
}
