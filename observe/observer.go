// Package observe is where the outbox reports what it does, for metrics
// and traces: a registry reports to one [Observer] and one [Tracer]
// (outbox.Registry's SetObserver and SetTracer). The outboxmetrics and
// outboxotel packages implement them.
package observe

// Observer is told what the outbox does, per tracked topic and consumer (the
// handler name, "" outside a router), for metrics. Its methods are called on
// the tracked paths only (never for messages without outbox metadata), from
// many goroutines at once, and must return quickly. The outboxmetrics
// package provides Prometheus collectors that implement it.
type Observer interface {
	// Published counts tracked messages saved and sent by the publisher.
	Published(topic string, n int)
	// Completed counts deliveries completed after their handler succeeded
	// or dropped the message, and those remote consumers confirmed.
	Completed(topic, consumer string)
	// DuplicateSkipped counts deliveries acknowledged without running the
	// handler because the consumer had already completed the record.
	DuplicateSkipped(topic, consumer string)
	// Failed counts handler failures that left the record pending or
	// abandoned it.
	Failed(topic, consumer string)
	// Abandoned counts deliveries abandoned after their last allowed attempt.
	Abandoned(topic, consumer string)
	// Resent counts records sent again: by startup replay, the stale
	// resubmitter or a requeue of an abandoned record, as kind says.
	Resent(topic string, kind ResendKind, n int)
	// NotOwned counts messages with outbox metadata that this service does
	// not own: another service's table, another topic's record, or a
	// handler that is not a consumer of the record. Their handler runs
	// untracked.
	NotOwned(topic, consumer string)
	// UnknownRecord counts messages whose metadata names a record of this
	// service's table that does not exist (never saved, or cleaned up).
	// They are acknowledged without running the handler.
	UnknownRecord(topic, consumer string)
	// Mismatched counts messages whose metadata names a pending or
	// completed record of this service's table that was saved for another
	// message (another UUID): a forged or corrupted message; and those
	// with a value the table cannot keep (a UUID or handler name). They
	// are acknowledged without running the handler, and the record is left
	// for its own message.
	Mismatched(topic, consumer string)
}

// ConfirmationObserver is implemented by an [Observer] that also counts
// confirmations, found by type assertion: the outboxmetrics package's
// collector does.
type ConfirmationObserver interface {
	// ConfirmationRejected counts confirmations that completed nothing
	// because they match no delivery of this service: malformed, of
	// another table, of an undeclared remote consumer, or naming another
	// message than the record's.
	ConfirmationRejected(topic, consumer string)
}

// InboxObserver is implemented by an [Observer] that also counts what a
// receiving service's inbox skips, found by type assertion: the
// outboxmetrics package's collector does.
type InboxObserver interface {
	// BusinessKeyDuplicate counts messages of other services acknowledged
	// without running the handler because the consumer had handled
	// another message with the same business key
	// (outbox.MiddlewareConfig.BusinessKey). They are counted as
	// DuplicateSkipped too.
	BusinessKeyDuplicate(topic, consumer string)
}

// Observers returns an Observer that reports to each of obs in turn, for a
// registry observed by more than one (for example the Prometheus collector
// and the OpenTelemetry metrics while moving from one to the other). Nil
// entries are skipped; with none left it returns nil, which
// the registry's SetObserver takes as no observer.
func Observers(obs ...Observer) Observer {
	var m multiObserver
	for _, o := range obs {
		if o == nil {
			continue
		}
		if inner, ok := o.(multiObserver); ok {
			m = append(m, inner...)
			continue
		}
		m = append(m, o)
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

type multiObserver []Observer

func (m multiObserver) Published(topic string, n int) {
	for _, o := range m {
		o.Published(topic, n)
	}
}

func (m multiObserver) Completed(topic, consumer string) {
	for _, o := range m {
		o.Completed(topic, consumer)
	}
}

func (m multiObserver) DuplicateSkipped(topic, consumer string) {
	for _, o := range m {
		o.DuplicateSkipped(topic, consumer)
	}
}

func (m multiObserver) Failed(topic, consumer string) {
	for _, o := range m {
		o.Failed(topic, consumer)
	}
}

func (m multiObserver) Abandoned(topic, consumer string) {
	for _, o := range m {
		o.Abandoned(topic, consumer)
	}
}

func (m multiObserver) Resent(topic string, kind ResendKind, n int) {
	for _, o := range m {
		o.Resent(topic, kind, n)
	}
}

func (m multiObserver) NotOwned(topic, consumer string) {
	for _, o := range m {
		o.NotOwned(topic, consumer)
	}
}

func (m multiObserver) UnknownRecord(topic, consumer string) {
	for _, o := range m {
		o.UnknownRecord(topic, consumer)
	}
}

func (m multiObserver) ConfirmationRejected(topic, consumer string) {
	for _, o := range m {
		if c, ok := o.(ConfirmationObserver); ok {
			c.ConfirmationRejected(topic, consumer)
		}
	}
}

func (m multiObserver) Mismatched(topic, consumer string) {
	for _, o := range m {
		o.Mismatched(topic, consumer)
	}
}

func (m multiObserver) BusinessKeyDuplicate(topic, consumer string) {
	for _, o := range m {
		if c, ok := o.(InboxObserver); ok {
			c.BusinessKeyDuplicate(topic, consumer)
		}
	}
}
