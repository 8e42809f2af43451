package sqlstore

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// encodeMetadata stores metadata as a JSON object. JSON cannot carry invalid
// UTF-8 (encoding/json would silently replace it), so such metadata is
// refused rather than changed.
func encodeMetadata(md message.Metadata) (string, error) {
	if len(md) == 0 {
		return "{}", nil
	}
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return "", fmt.Errorf("%w: metadata key %q is not valid UTF-8", ErrInvalidRecord, k)
		}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return "", fmt.Errorf("%w: metadata: %v", ErrInvalidRecord, err)
	}
	return string(b), nil
}

func decodeMetadata(s string) (message.Metadata, error) {
	md := message.Metadata{}
	if s == "" || s == "{}" {
		return md, nil
	}
	if err := json.Unmarshal([]byte(s), &md); err != nil {
		return nil, fmt.Errorf("metadata is not a JSON object of strings: %w", err)
	}
	return md, nil
}

func payloadOf(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
