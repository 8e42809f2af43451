package outbox

// Observer is told what the outbox does, per tracked topic and consumer (the
// handler name, "" outside a router), for metrics. Its methods are called on
// the tracked paths only (never for messages without outbox metadata), from
// many goroutines at once, and must return quickly. The outboxmetrics
// package provides Prometheus collectors that implement it.
type Observer interface {
	// Published counts tracked messages saved and sent by the publisher.
	Published(topic string, n int)
	// Handled counts deliveries completed after their handler succeeded or
	// dropped the message.
	Handled(topic, consumer string)
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

// observerBox lets an interface value live in an atomic.Pointer.
type observerBox struct{ o Observer }

// SetObserver makes the registry's publishers, middlewares and senders
// report to o; nil stops the reports. It may be called at any time; reading
// it costs one atomic load on the tracked paths.
func (r *Registry) SetObserver(o Observer) {
	if o == nil {
		r.obs.Store(nil)
		return
	}
	r.obs.Store(&observerBox{o: o})
}

// observer returns the observer, or one that discards every report.
func (r *Registry) observer() Observer {
	if b := r.obs.Load(); b != nil {
		return b.o
	}
	return nopObserver{}
}

type nopObserver struct{}

func (nopObserver) Published(string, int)           {}
func (nopObserver) Handled(string, string)          {}
func (nopObserver) DuplicateSkipped(string, string) {}
func (nopObserver) Failed(string, string)           {}
func (nopObserver) Abandoned(string, string)        {}
func (nopObserver) Resent(string, ResendKind, int)  {}
func (nopObserver) NotOwned(string, string)         {}
func (nopObserver) UnknownRecord(string, string)    {}
func (nopObserver) Mismatched(string, string)       {}

// Observers returns an Observer that reports to each of obs in turn, for a
// registry observed by more than one (for example the Prometheus collector
// and the OpenTelemetry metrics while moving from one to the other). Nil
// entries are skipped; with none left it returns nil, which
// [Registry.SetObserver] takes as no observer.
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

func (m multiObserver) Handled(topic, consumer string) {
	for _, o := range m {
		o.Handled(topic, consumer)
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
