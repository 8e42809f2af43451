package storetest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/recordstore"
)

func (s *contract) testRoundTrip(t *testing.T) {
	t.Run("FourMiBPayloadWithEveryByteValue", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		payload := make([]byte, 4<<20)
		for i := range 256 {
			payload[i] = byte(i) // every byte value, in order, up front
		}
		rnd := rand.New(rand.NewPCG(4, 20))
		for i := 256; i < len(payload); i++ {
			payload[i] = byte(rnd.Uint32())
		}
		rec := []recordstore.Record{{Topic: "blobs", UUID: "big", Payload: bytes.Clone(payload)}}
		insert(t, store, rec)

		got := only(t, store, "blobs")
		assert.Equal(t, rec[0].ID, got.ID)
		assert.Equal(t, len(payload), len(got.Payload))
		assert.True(t, bytes.Equal(payload, got.Payload), "the payload comes back byte for byte")
	})

	t.Run("UnicodeMetadata", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		md := message.Metadata{
			"ключ":            "значение",
			"鍵":               "値 with 'quotes', \"double quotes\" and a \\ backslash",
			"🔑":               "🚚📦 (four-byte code points)",
			"e\u0301":         "combining accent, not é",
			"עברית":           "right-to-left",
			"tab\tnewline\n":  "control\u0001characters\r\n",
			"":                "empty key",
			"empty value":     "",
			"percent %s %d ?": "placeholders are data",
		}
		rec := []recordstore.Record{{Topic: "unicode", UUID: "ユーユーアイディー", Payload: []byte("x"), Metadata: md}}
		insert(t, store, rec)

		got := only(t, store, "unicode")
		assert.Equal(t, md, got.Metadata)
		assert.Equal(t, "ユーユーアイディー", got.UUID)
	})

	t.Run("EmptyPayloadAndMetadata", func(t *testing.T) {
		t.Parallel()
		store := s.store(t, Mark)
		insert(t, store, []recordstore.Record{{Topic: "empty", UUID: "u"}})
		got := only(t, store, "empty")
		assert.Equal(t, []byte{}, got.Payload)
		assert.Empty(t, got.Metadata)
	})
}

// only returns the single pending record of the topic.
func only(t testing.TB, store recordstore.Store, topic string) recordstore.Record {
	t.Helper()
	recs, err := store.PendingAfter(ctx(t), topic, 0, 10)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	return recs[0]
}
