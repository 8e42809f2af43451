package outbox_test

import (
	"bytes"
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

// TestPayloadsRoundTripThroughRecordAndReplay sends payloads of 0 bytes,
// 16 MiB and invalid UTF-8 through the record and a replay, byte for byte.
func TestPayloadsRoundTripThroughRecordAndReplay(t *testing.T) {
	t.Parallel()
	big := make([]byte, 16<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	payloads := map[string][]byte{
		"empty":        {},
		"nil":          nil,
		"invalid-utf8": {0xff, 0xfe, 0xc3, 0x28, 0x00, 'a'},
		"16MiB":        big,
	}
	forEachBackend(t, func(t *testing.T, backend testenv.Backend) {
		b := setup(t, backend, sqlstore.Mark)
		lost := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		pub, err := outbox.NewPublisher(b.reg, lost)
		require.NoError(t, err)
		want := len(payloads)
		for name, p := range payloads {
			err := pub.Publish(b.topic, message.NewMessage(name, p))
			if backend.Name == "MariaDB" && len(p) > 0 && !fitsMySQLPacket(t, b, len(p)) {
				// The documented outcome where the server refuses the size.
				require.ErrorIs(t, err, sqlstore.ErrRecordTooLarge, name)
				want--
				continue
			}
			require.NoError(t, err, name)
		}
		require.NoError(t, lost.Close())

		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer gc.Close()
		sent := &recordingPublisher{Publisher: gc}
		res, err := outbox.Replay(b.ctx(t), b.reg, sent, outbox.ReplayConfig{PageSize: 1}, nil)
		require.NoError(t, err)
		require.Equal(t, want, res.Total())
		require.Equal(t, want, b.rowCount(t), "a refused payload leaves no record")
		for _, m := range sent.msgs {
			want := payloads[m.UUID]
			assert.True(t, bytes.Equal(want, m.Payload), "%s: %d bytes replayed, %d published", m.UUID, len(m.Payload), len(want))
			assert.NotNil(t, m.Payload, "%s: replayed payload is never nil", m.UUID)
		}
	})
}

// fitsMySQLPacket reports whether a payload of n bytes, escaped at worst to
// twice its size, fits the server's max_allowed_packet.
func fitsMySQLPacket(t *testing.T, b *bundle, n int) bool {
	var packet int
	require.NoError(t, b.db.GetContext(b.ctx(t), &packet, "SELECT @@max_allowed_packet"))
	return 2*n+4096 <= packet
}
