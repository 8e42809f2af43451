package outbox

// Observing: the registry reports what it does to an observe.Observer and
// an observe.Tracer, each read with one atomic load on the tracked paths.

import "github.com/wmoutbox/outbox/observe"

// observerBox lets an interface value live in an atomic.Pointer.
type observerBox struct{ o observe.Observer }

// SetObserver makes the registry's publishers, middlewares and senders
// report to o; nil stops the reports. It may be called at any time; reading
// it costs one atomic load on the tracked paths.
func (r *Registry) SetObserver(o observe.Observer) {
	if o == nil {
		r.obs.Store(nil)
		return
	}
	r.obs.Store(&observerBox{o: o})
}

// observer returns the observer, or one that discards every report.
func (r *Registry) observer() observe.Observer {
	if b := r.obs.Load(); b != nil {
		return b.o
	}
	return nopObserver{}
}

type nopObserver struct{}

func (nopObserver) Published(string, int)                  {}
func (nopObserver) Completed(string, string)               {}
func (nopObserver) DuplicateSkipped(string, string)        {}
func (nopObserver) Failed(string, string)                  {}
func (nopObserver) Abandoned(string, string)               {}
func (nopObserver) Resent(string, observe.ResendKind, int) {}
func (nopObserver) NotOwned(string, string)                {}
func (nopObserver) UnknownRecord(string, string)           {}
func (nopObserver) Mismatched(string, string)              {}

// tracerBox lets an interface value live in an atomic.Pointer.
type tracerBox struct{ t observe.Tracer }

// SetTracer makes the registry's publishers, middlewares and senders report
// their steps to t; nil stops the reports. It may be called at any time;
// reading it costs one atomic load on the tracked paths, and nothing on the
// untracked ones.
func (r *Registry) SetTracer(t observe.Tracer) {
	if t == nil {
		r.trc.Store(nil)
		return
	}
	r.trc.Store(&tracerBox{t: t})
}

// tracer returns the tracer, or nil.
func (r *Registry) tracer() observe.Tracer {
	if b := r.trc.Load(); b != nil {
		return b.t
	}
	return nil
}

// endStep calls a step's end function when the tracer returned one.
func endStep(end func(error), err error) {
	if end != nil {
		end(err)
	}
}
