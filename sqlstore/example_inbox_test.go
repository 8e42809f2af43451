package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// A receiving service keeps an inbox of the other services' messages it
// handled, and saves each entry in the handler's own transaction: the
// entry commits with the handler's writes, and a copy of the message sent
// again finds it and is acknowledged without running the handler twice.
func ExampleInbox() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "inbox")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(dir, "billing.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "CREATE TABLE invoices (order_id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}

	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: sqlstore.SQLite(), DB: db})
	if err != nil {
		panic(err)
	}
	if err := inbox.Migrate(ctx); err != nil {
		panic(err)
	}

	// handle is the handler of the "billing" consumer: it invoices an
	// order once, however many copies of the message arrive.
	handle := func(messageUUID, orderID string) error {
		e := recordstore.InboxEntry{Consumer: "billing", MessageUUID: messageUUID, BusinessKey: orderID}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // rolled back only when not committed
		if err := inbox.MarkHandledTx(ctx, tx, e); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id) VALUES (?)", orderID); err != nil {
			return err
		}
		return tx.Commit()
	}

	fmt.Println(handle("msg-1", "order-1"))
	err = handle("msg-1", "order-1") // the same message, delivered again
	fmt.Println(errors.Is(err, recordstore.ErrAlreadyHandled))
	err = handle("msg-2", "order-1") // another message for the same order
	fmt.Println(errors.Is(err, recordstore.ErrAlreadyHandled))

	var invoices int
	if err := db.GetContext(ctx, &invoices, "SELECT COUNT(*) FROM invoices"); err != nil {
		panic(err)
	}
	fmt.Println(invoices, "invoice")
	// Output:
	// <nil>
	// true
	// true
	// 1 invoice
}
