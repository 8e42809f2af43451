package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

// declarer is a fresh marking store as a ConsumerDeclarer and a
// ConsumerRetirer, skipping the test when it is not both.
func (s *contract) declarer(t *testing.T) (recordstore.Store, recordstore.ConsumerDeclarer, recordstore.ConsumerRetirer) {
	t.Helper()
	store := s.store(t, Mark)
	return store, need[recordstore.ConsumerDeclarer](t, store), need[recordstore.ConsumerRetirer](t, store)
}

// ordersDeclaring is a start's declaration of "orders" with local and
// remote consumers.
func ordersDeclaring(local, remote []string) []recordstore.Declaration {
	return []recordstore.Declaration{{Topic: "orders", Consumers: local, RemoteConsumers: remote}}
}

// requireDeclared asserts that err is the refusal of a retire of a
// consumer the latest start declared just now.
func requireDeclared(t *testing.T, err error, consumer string, remote bool) {
	t.Helper()
	var declared *recordstore.ConsumerDeclaredError
	require.ErrorAs(t, err, &declared)
	require.ErrorIs(t, err, recordstore.ErrConsumerDeclared)
	assert.Equal(t, "orders", declared.Topic)
	assert.Equal(t, consumer, declared.Consumer)
	assert.Equal(t, remote, declared.Remote)
	assert.Less(t, declared.Since, time.Hour, "declared by the start of a moment ago")
	assert.Contains(t, err.Error(), `"`+consumer+`"`)
}

// testDeclarations: [recordstore.ConsumerDeclarer], in a store that the
// starts of services write their declarations to, and that tools without
// their registry retire from.
func (s *contract) testDeclarations(t *testing.T) {
	t.Run("RetireRefusesAConsumerTheLatestStartDeclares", func(t *testing.T) {
		t.Parallel()
		store, d, r := s.declarer(t)
		insert(t, store, withConsumers(3, twoConsumers...))
		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring([]string{"billing"}, []string{"shipping"})))

		n, err := r.Retire(ctx(t), "orders", "shipping")
		requireDeclared(t, err, "shipping", true)
		assert.Zero(t, n)
		_, err = r.Retire(ctx(t), "orders", "billing")
		requireDeclared(t, err, "billing", false)
		assert.Len(t, pendingIDs(t, store), 3, "nothing was completed")

		// The next start declares billing alone: shipping can go.
		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring([]string{"billing"}, nil)))
		n, err = r.Retire(ctx(t), "orders", "shipping")
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		_, err = r.Retire(ctx(t), "orders", "billing")
		requireDeclared(t, err, "billing", false)

		// A start that declares no consumers (one receiver) declares
		// neither.
		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring(nil, nil)))
		n, err = r.Retire(ctx(t), "orders", "billing")
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		assert.Empty(t, pendingIDs(t, store))
	})

	t.Run("ATopicNoStartDeclaredIsRetiredAsAsked", func(t *testing.T) {
		t.Parallel()
		store, d, r := s.declarer(t)
		payments := records("payments", 2)
		for i := range payments {
			payments[i].Consumers = twoConsumers
		}
		insert(t, store, payments)
		n, err := r.Retire(ctx(t), "payments", "shipping")
		require.NoError(t, err, "no start ever declared anything")
		assert.Equal(t, 2, n)

		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring(twoConsumers, nil)))
		n, err = r.Retire(ctx(t), "payments", "billing")
		require.NoError(t, err, "the declarations of another topic")
		assert.Equal(t, 2, n)
	})

	t.Run("EachTopicKeepsItsLatestDeclaration", func(t *testing.T) {
		t.Parallel()
		// Two services share the store: one declares orders, the other
		// payments; neither's start replaces the other's.
		_, d, r := s.declarer(t)
		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring([]string{"billing"}, nil)))
		require.NoError(t, d.DeclareConsumers(ctx(t), []recordstore.Declaration{{Topic: "payments", Consumers: []string{"ledger"}}}))
		_, err := r.Retire(ctx(t), "orders", "billing")
		requireDeclared(t, err, "billing", false)
		_, err = r.Retire(ctx(t), "payments", "billing")
		require.NoError(t, err, "billing is not a consumer of payments")
	})

	t.Run("StartsDeclareAtOnce", func(t *testing.T) {
		t.Parallel()
		// Instances of one service start together, on a table none has
		// declared in yet.
		_, d, r := s.declarer(t)
		decls := []recordstore.Declaration{
			{Topic: "orders", Consumers: []string{"billing"}, RemoteConsumers: []string{"shipping"}},
			{Topic: "payments", Consumers: []string{"ledger"}},
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = d.DeclareConsumers(ctx(t), decls) })
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "start %d", i)
		}
		_, err := r.Retire(ctx(t), "orders", "shipping")
		requireDeclared(t, err, "shipping", true)
	})

	t.Run("StatusTellsRemoteConsumers", func(t *testing.T) {
		t.Parallel()
		store, d, _ := s.declarer(t)
		sr := need[recordstore.StatusReader](t, store)
		recs := insert(t, store, withConsumers(2, twoConsumers...))
		require.NoError(t, store.Complete(ctx(t), consumerDlv(recs[0].ID, "billing")))
		before := pendingStatus(t, sr)["orders"].Consumers
		require.Len(t, before, 2)
		assert.False(t, before[1].Remote, "no start declared shipping yet")

		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring([]string{"billing"}, []string{"shipping"})))
		for _, read := range []func() ([]recordstore.TopicStatus, error){
			func() ([]recordstore.TopicStatus, error) { return sr.PendingStatus(ctx(t)) },
			func() ([]recordstore.TopicStatus, error) { return sr.Status(ctx(t)) },
		} {
			sts, err := read()
			require.NoError(t, err)
			require.Len(t, sts, 1)
			cs := sts[0].Consumers
			require.Len(t, cs, 2)
			assert.Equal(t, "billing", cs[0].Consumer)
			assert.False(t, cs[0].Remote)
			assert.Equal(t, int64(1), cs[0].Pending)
			assert.Equal(t, "shipping", cs[1].Consumer)
			assert.True(t, cs[1].Remote, "declared remote: its pending deliveries await its confirmation")
			assert.Equal(t, int64(2), cs[1].Pending)
			assert.Positive(t, cs[1].OldestPending)
		}
	})

	t.Run("InvalidDeclarationsWriteNothing", func(t *testing.T) {
		t.Parallel()
		_, d, r := s.declarer(t)
		require.NoError(t, d.DeclareConsumers(ctx(t), ordersDeclaring([]string{"billing"}, nil)))
		for name, decls := range map[string][]recordstore.Declaration{
			"NoTopic":          {{Consumers: []string{"billing"}}},
			"TopicTwice":       {{Topic: "orders"}, {Topic: "orders"}},
			"EmptyConsumer":    ordersDeclaring([]string{""}, nil),
			"ConsumerTwice":    ordersDeclaring([]string{"billing"}, []string{"billing"}),
			"ValidThenInvalid": {{Topic: "orders"}, {Topic: "payments", Consumers: []string{"a", "a"}}},
		} {
			assert.ErrorIs(t, d.DeclareConsumers(ctx(t), decls), recordstore.ErrInvalidConfig, name)
		}
		_, err := r.Retire(ctx(t), "orders", "billing")
		requireDeclared(t, err, "billing", false)
	})
}
