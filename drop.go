package outbox

import "errors"

type dropError struct{ err error }

func (d dropError) Error() string {
	if d.err == nil {
		return ErrDropped.Error()
	}
	return ErrDropped.Error() + ": " + d.err.Error()
}

func (d dropError) Unwrap() []error { return []error{ErrDropped, d.err} }

// Drop wraps a handler error to say the message is to be discarded: the
// middleware completes its record (it is never delivered again) and
// acknowledges the message. errors.Is(Drop(err), err) and
// errors.Is(Drop(err), ErrDropped) both hold; err may be nil.
//
// To divert dropped messages to a poison queue instead of discarding them, add
// Watermill's PoisonQueueWithFilter(pub, topic, outbox.IsDrop) inside the
// outbox middleware: the poison middleware publishes the message and
// acknowledges, and the outbox middleware then completes the record.
func Drop(err error) error { return dropError{err: err} }

// IsDrop reports whether err was built with [Drop].
func IsDrop(err error) bool { return errors.Is(err, ErrDropped) }
