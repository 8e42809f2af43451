// Package recordstore is the contract between the outbox and the stores
// that keep its records: the record and delivery types, the [Store]
// interface with the optional interfaces a store may add, and the sentinels
// a store returns. The sqlstore package implements it for PostgreSQL,
// MySQL/MariaDB and SQLite, and the outboxtest package in memory, for
// tests; a store of another kind implements it too, and runs the contract
// suite, sqlstore/storetest's RunContract, against itself.
//
// Code that adopts the outbox does not need this package: it hands a store
// to outbox.Tracked and handles outbox's errors.
package recordstore
