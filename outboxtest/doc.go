// Package outboxtest is a kit for testing code that uses the outbox: an
// in-memory record store.
package outboxtest
