package outbox_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/observe"
	"github.com/wmoutbox/outbox/sqlstore"
)

// tally is an Observer that counts each report by kind.
type tally struct {
	mu sync.Mutex
	n  map[string]int
}

func newTally() *tally { return &tally{n: map[string]int{}} }

func (c *tally) add(kind string, n int) {
	c.mu.Lock()
	c.n[kind] += n
	c.mu.Unlock()
}

func (c *tally) get(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[kind]
}

func (c *tally) Published(_ string, n int)                    { c.add("published", n) }
func (c *tally) Completed(string, string)                     { c.add("handled", 1) }
func (c *tally) DuplicateSkipped(string, string)              { c.add("duplicate", 1) }
func (c *tally) Failed(string, string)                        { c.add("failed", 1) }
func (c *tally) Abandoned(string, string)                     { c.add("abandoned", 1) }
func (c *tally) Resent(_ string, _ observe.ResendKind, n int) { c.add("replayed", n) }
func (c *tally) NotOwned(string, string)                      { c.add("not owned", 1) }
func (c *tally) UnknownRecord(string, string)                 { c.add("unknown", 1) }
func (c *tally) Mismatched(string, string)                    { c.add("mismatched", 1) }

// TestObserversReportToEach: one registry observed by two observers (say
// Prometheus and OpenTelemetry) gets every report to both.
func TestObserversReportToEach(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		first, second := newTally(), newTally()
		b.reg.SetObserver(observe.Observers(first, nil, second))

		msgs := b.publishTracked(t, 3)
		dup := msgs[0].Copy()
		mw := b.middleware(t)
		handled := &recordingHandler{}
		for _, msg := range msgs {
			_, err := mw(handled.handle)(msg)
			require.NoError(t, err)
		}
		_, err := mw(handled.handle)(dup) // a copy after completion
		require.NoError(t, err)
		require.EqualValues(t, 3, handled.runs.Load())

		for _, o := range []*tally{first, second} {
			assert.Equal(t, 3, o.get("published"))
			assert.Equal(t, 3, o.get("handled"))
			assert.Equal(t, 1, o.get("duplicate"))
		}
	})
}

func TestObserversFlattensAndDropsNil(t *testing.T) {
	t.Parallel()
	one := newTally()
	assert.Nil(t, observe.Observers())
	assert.Nil(t, observe.Observers(nil, nil))
	assert.Same(t, one, observe.Observers(nil, one), "a single observer is returned as it is")

	two, three := newTally(), newTally()
	nested := observe.Observers(observe.Observers(one, two), three)
	nested.Published("orders", 5)
	nested.Completed("orders", "h")
	nested.DuplicateSkipped("orders", "h")
	nested.Failed("orders", "h")
	nested.Abandoned("orders", "h")
	nested.Resent("orders", observe.ResendReplay, 2)
	nested.NotOwned("orders", "h")
	nested.UnknownRecord("orders", "h")
	nested.Mismatched("orders", "h")
	want := map[string]int{"published": 5, "handled": 1, "duplicate": 1, "failed": 1,
		"abandoned": 1, "replayed": 2, "not owned": 1, "unknown": 1, "mismatched": 1}
	for _, o := range []*tally{one, two, three} {
		assert.Equal(t, want, o.n)
	}
}
