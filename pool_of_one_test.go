package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestPublishInsideATransactionOfAPoolOfOne publishes a tracked message
// through the store's pool while a transaction (a handler's CompleteTx
// transaction) holds its only connection, as the README's SQLite setup has
// it: the insert cannot get a connection, and Publish fails after the
// insert's bound with an error naming the fix, instead of waiting for ever.
// Topology: SQLite, a pool of one connection, one publisher.
func TestPublishInsideATransactionOfAPoolOfOne(t *testing.T) {
	defer outbox.SetInsertTimeout(300 * time.Millisecond)()
	sqlite := testenv.Backends()[1]
	require.Equal(t, "SQLite", sqlite.Name)
	b := setup(t, sqlite, sqlstore.Mark)
	require.Equal(t, 1, b.db.Stats().MaxOpenConnections)
	raw := &countingPublisher{Publisher: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	defer raw.Close()
	pub, err := outbox.NewPublisher(b.reg, raw)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(b.topic, message.NewMessage("warm-up", nil)), "reads the table's identity")

	tx, err := b.db.BeginTx(b.ctx(t), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // only held
	msg := message.NewMessage("inside", nil)
	// Without the insert's own bound this deadline would end the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg.SetContext(ctx)
	err = pub.Publish(b.topic, msg)
	var insErr *outbox.InsertError
	require.ErrorAs(t, err, &insErr)
	assert.False(t, insErr.OutcomeUnknown, "it never got a connection: nothing was saved")
	assert.Contains(t, err.Error(), "TxPublisher", "the error names the fix")
	assert.Contains(t, err.Error(), "all 1 connection(s) of the pool were in use")
	_, sent := raw.counts()
	assert.Equal(t, 1, sent, "only the warm-up was sent")
}
