package outbox

import (
	"context"
	"time"
)

// DefaultStatementTimeout bounds each database statement of the outbox
// whose context has no deadline and whose configuration sets no timeout of
// its own: the record insert of a Publish whose message context has no
// deadline, and the reads of [ReadStatus] on a context without one. It is
// also the default of the StatementTimeout fields of [ReplayConfig],
// [StaleResubmitterConfig] and [CleanerConfig]. A database that accepts
// connections and never answers (a table locked by a migration, a
// partitioned network) then makes the call fail with the driver's deadline
// error instead of hanging. To choose another bound, give the context (for
// Publish, the message's: msg.SetContext) a deadline of its own.
const DefaultStatementTimeout = 30 * time.Second

// withDefaultDeadline bounds ctx by DefaultStatementTimeout, unless it has
// a deadline already.
func withDefaultDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultStatementTimeout)
}
