package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestToggleOffInTestBinary is not parallel: it changes the environment.
func TestToggleOffInTestBinary(t *testing.T) {
	backend := testenv.Backends()[1] // SQLite: no server needed
	db := backend.Open(t)
	store := testenv.NewStore(t, backend, db, sqlstore.Mark)

	t.Setenv(outbox.EnvToggle, "")
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	assert.False(t, reg.Enabled())
	assert.Nil(t, reg.Store("orders"))

	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer gc.Close()
	pub, err := outbox.NewPublisher(reg, gc)
	require.NoError(t, err)
	assert.Same(t, gc, pub, "the publisher is returned undecorated")
	require.NoError(t, pub.Publish("orders", message.NewMessage("u", nil)))
	var n int
	require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM "+store.Table()))
	assert.Zero(t, n, "nothing is recorded")

	mw, err := outbox.NewMiddleware(reg, outbox.MiddlewareConfig{}, nil)
	require.NoError(t, err)
	msg := message.NewMessage("u", nil)
	msg.Metadata.Set(outbox.MetadataID, "424242") // a record that does not exist
	msg.Metadata.Set(outbox.MetadataTopic, "orders")
	ran := false
	_, err = mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(msg)
	require.NoError(t, err)
	assert.True(t, ran, "the handler runs as if the middleware were absent")

	tracking, err := outbox.NewTrackingRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	assert.True(t, tracking.Enabled(), "NewTrackingRegistry tracks without the toggle")
	trackedPub, err := outbox.NewPublisher(tracking, gc)
	require.NoError(t, err)
	require.NoError(t, trackedPub.Publish("orders", message.NewMessage("u", nil)))
	require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM "+store.Table()))
	assert.Equal(t, 1, n, "its publisher records")
	_, err = outbox.NewTrackingRegistry(outbox.Tracked{Topic: "orders"})
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "it checks its configuration as NewRegistry does")

	t.Setenv(outbox.EnvToggle, "on")
	reg, err = outbox.NewRegistry(outbox.Tracked{Topic: "orders", Store: store})
	require.NoError(t, err)
	assert.True(t, reg.Enabled())
}

// TestNormalBinaryAlwaysTracks builds a real program and runs it with the
// toggle set to off: outside a test binary the variable is never read.
func TestNormalBinaryAlwaysTracks(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	bin := filepath.Join(t.TempDir(), "trackingcheck")
	build := exec.Command(gobin, "build", "-o", bin, "./testdata/trackingcheck")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	run := exec.Command(bin)
	run.Env = append(os.Environ(), outbox.EnvToggle+"=off")
	out, err = run.CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Equal(t, "tracking=true", strings.TrimSpace(string(out)))
}
