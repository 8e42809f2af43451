package outbox

// Observer is told what the outbox does, per tracked name, for metrics. Its
// methods are called on the tracked paths only (never for untracked
// messages), from many goroutines at once, and must return quickly. The
// outboxmetrics package provides Prometheus collectors that implement it.
type Observer interface {
	// Published counts tracked messages saved and sent by the publisher.
	Published(name string, n int)
	// Handled counts records completed after their handler succeeded or
	// dropped the message.
	Handled(name string)
	// DuplicateSkipped counts deliveries acknowledged without running the
	// handler because their record was no longer pending.
	DuplicateSkipped(name string)
	// Failed counts handler failures that left the record pending or
	// abandoned it.
	Failed(name string)
	// Abandoned counts records abandoned after their last allowed attempt.
	Abandoned(name string)
	// Replayed counts records sent again by startup replay, the stale
	// resubmitter or a resubmit of an abandoned record.
	Replayed(name string, n int)
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

// observer returns the observer, or nil.
func (r *Registry) observer() Observer {
	if b := r.obs.Load(); b != nil {
		return b.o
	}
	return nil
}
