package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// A confirmation is the message a receiver in another service publishes to
// complete its delivery of a tracked message: its payload is this JSON
// object, and it names the record (the sender's table identity, topic and
// id), the message the receiver handled (its UUID) and the receiver (the
// consumer's handler name). The sender completes the consumer's delivery
// only when all of them match a pending delivery.
//
// A receiver whose handler failed publishes the same object with Failed,
// its error: the sender counts the failure toward its MaxAttempts and
// sends the message again. Receiver names the receiving service (its
// inbox's table identity, "" without one), so that the sender sees two
// services that confirm under one consumer name.
type confirmation struct {
	Store    string `json:"store"`
	Topic    string `json:"topic"`
	ID       int64  `json:"id"`
	UUID     string `json:"uuid"`
	Consumer string `json:"consumer"`
	Failed   string `json:"failed,omitempty"`
	Receiver string `json:"receiver,omitempty"`
	// to is the topic the confirmation goes to; unexported, so not part
	// of the payload.
	to string
}

// maxFailureText bounds the error text a failure report carries, so that
// the report stays within maxConfirmation.
const maxFailureText = 1024

// maxConfirmation bounds a confirmation's payload: every field is a name
// or an id, and a larger payload is not one.
const maxConfirmation = 4096

// errBadConfirmation is wrapped by the error of a confirmation that cannot
// be read.
var errBadConfirmation = errors.New("outbox: malformed confirmation")

func (c confirmation) marshal() []byte {
	b, _ := json.Marshal(c) // strings and an int64 always marshal
	return b
}

// parseConfirmation reads a confirmation's payload, refusing anything that
// is not one: too large, not the JSON object, a field missing or empty, an
// id that is not positive, text that is not UTF-8.
func parseConfirmation(payload []byte) (confirmation, error) {
	var c confirmation
	if len(payload) > maxConfirmation {
		return c, fmt.Errorf("%w: %d bytes", errBadConfirmation, len(payload))
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return confirmation{}, fmt.Errorf("%w: %v", errBadConfirmation, err)
	}
	switch {
	case c.Store == "", c.Topic == "", c.UUID == "", c.Consumer == "":
		return confirmation{}, fmt.Errorf("%w: store, topic, uuid and consumer are required", errBadConfirmation)
	case c.ID <= 0:
		return confirmation{}, fmt.Errorf("%w: id %d is not positive", errBadConfirmation, c.ID)
	case !utf8.ValidString(c.Store + c.Topic + c.UUID + c.Consumer + c.Failed + c.Receiver):
		return confirmation{}, fmt.Errorf("%w: text is not UTF-8", errBadConfirmation)
	}
	return c, nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
