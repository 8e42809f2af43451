package scenarios

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
)

// fastPathDrains: two declared consumers in one service with the
// middleware's defaults, under which first copies run unchecked and
// completions are gathered in the background. Each consumer handles every
// message once; once the router closed and WaitCompletions returned, every
// delivery is complete, and a second start runs nothing again.
func fastPathDrains(t *testing.T, e *env) {
	consumers := []string{"email", "stats"}
	e.declare(consumers...)
	obs := newCounts()
	e.reg.SetObserver(obs)
	logger := &testenv.CaptureLogger{}
	fast := outbox.MiddlewareConfig{}
	pub, _ := e.connect()
	svc := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub, receivers: e.receiversOf(consumers...), decide: succeed, logger: logger, mw: fast})

	msgs, uuids := newMessages("fast", fanOutMessages)
	publish(t, e.tracked(pub), e.topic, msgs)
	got := svc.handledByEach(consumers, uuids)
	svc.stop()
	require.NoError(t, e.reg.WaitCompletions(e.ctx()))

	for _, c := range consumers {
		for _, u := range uuids {
			assert.True(t, got[runKey{c, u}].Tracked, "%s handles %s tracked", c, u)
			assert.Equal(t, 1, svc.runsOf(c, u), "%s ran for %s", c, u)
		}
		assert.Equal(t, fanOutMessages, obs.get("handled", c), "%s completed its delivery of every record", c)
	}
	assert.Empty(t, logger.Entries("error"))
	e.requireTable(completedAll(uuids...))
	e.requireDeliveriesComplete(consumers, len(uuids))

	// A second start replays nothing: no handler runs again.
	pub2, _ := e.connect()
	again := e.startServiceWith(serviceConfig{reg: e.reg, pub: pub2, receivers: e.receiversOf(consumers...), decide: succeed, logger: logger, mw: fast})
	again.stop()
	assert.Zero(t, again.totalRuns(), "nothing was pending after WaitCompletions")
}
