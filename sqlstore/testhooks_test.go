package sqlstore

import (
	"context"
	"io/fs"
)

// MySQLWithoutReturning is the MySQL dialect taking the LAST_INSERT_ID() path,
// the one MySQL 8 takes, even on a MariaDB that has RETURNING.
func MySQLWithoutReturning() *Dialect { return mysqlDialect(true) }

// UseMigrations makes s read its migrations from fsys, laid out as
// migrations/<dialect>/NNN_name.sql, instead of the embedded ones.
func UseMigrations(s *Store, fsys fs.FS) { s.migrations = fsys }

// InsertsWithReturning probes the server of s, if not done yet, and reports
// whether its inserts use RETURNING.
func InsertsWithReturning(ctx context.Context, s *Store) (bool, error) {
	_, d, err := s.bound(ctx)
	if err != nil {
		return false, err
	}
	return d.server.returning, nil
}

// MigrationFiles are the embedded migrations.
var MigrationFiles fs.FS = migrationFiles

// CompletionStatements are the statements s completes with: on its own
// (alone, many, and the lock of a record with consumers), and in the
// caller's transaction.
func CompletionStatements(s *Store) (alone, many, lockAlone, inTx string) {
	return s.q.completeAlone, s.q.completeMany, s.q.lockRecordAlone, s.q.complete
}

// CheckStatement is the query of a combined check, "" where checks run one
// by one.
func CheckStatement(s *Store) string { return s.q.stateMany }

// PendingAfterStatement is the query of one replay page.
func PendingAfterStatement(s *Store) string { return s.q.pendingAfter }

// InboxStatements are the queries of an inbox's Handled, with and without a
// business key, and of its Clean.
func InboxStatements(in *Inbox) (handled, handledUUID, clean string) {
	return in.q.handled, in.q.handledUUID, in.q.clean
}

// InboxRecentStatement is the statement of Inbox.Recent.
func InboxRecentStatement(in *Inbox) string { return in.q.recent }

// UnheldCompletionStatement is the completion of one record on the
// coalesced path, "" where there is none.
func UnheldCompletionStatement(s *Store) string { return s.q.completeUnheld }

// OrderStatements are the statements of Predecessors and WaitingKeys.
func OrderStatements(s *Store) (predecessors, waitingKeys string) {
	return s.q.order.predecessors, s.q.order.waitingKeys
}

// PredecessorMessagesStatements are PredecessorMessages' statements, one
// per policy.
func PredecessorMessagesStatements(s *Store) [2]string { return s.q.order.predecessorMessages }
