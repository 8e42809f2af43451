package outbox

// Work in the background: what the outbox runs off a handler's path (the
// completions that follow an acknowledgement, unless
// MiddlewareConfig.Complete.BeforeAck; a completion on the router's
// acknowledgement, the resend of the next record of an order key,
// a receiver seen, the drain of a failed start) and the loops its router
// plugins run. The registry counts all of it, bounds the completions, and
// lets a service wait for it before it stops.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/internal/hooks"
	"github.com/wmoutbox/outbox/internal/loop"
)

// drainTimeout bounds how long a closing router's handler publisher waits
// for the completions in the background ([closingPublisher]).
const drainTimeout = 10 * time.Second

// closingPublisher is the publisher of a router's handler, decorated by
// [ReplayPlugin]: the router closes it when the handler stops, before its
// Close returns, and then the completions of the handler's messages that
// went in the background are committed first, and those of the messages
// still being handled go on the handlers' path (which the router waits
// for), so that a clean stop leaves no record pending for its completion.
type closingPublisher struct {
	message.Publisher
	reg  *Registry
	once sync.Once
}

func (p *closingPublisher) Close() error {
	p.once.Do(func() {
		p.reg.background.Draining.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		_ = p.reg.background.WaitCompletions(ctx)
	})
	return p.Publisher.Close()
}

// Unwrap returns the decorated publisher.
func (p *closingPublisher) Unwrap() message.Publisher { return p.Publisher }

func init() {
	hooks.RunWithRouter = func(reg any, run func(ctx context.Context) error) message.RouterPlugin {
		return runWithRouter(reg.(*Registry), run)
	}
}

// errNoHandlers is the error of a plugin added to a router without
// handlers, which never gives it a subscription's context.
var errNoHandlers = fmt.Errorf("%w: a background runner needs a router with at least one handler; call its Run method instead", ErrInvalidConfig)

// runWithRouter returns a router plugin that runs run while the router
// runs (loop.WithRouter), counted among the registry's loops, so that
// [Registry.WaitCompletions] waits for it once the router closes.
func runWithRouter(reg *Registry, run func(ctx context.Context) error) message.RouterPlugin {
	return loop.WithRouter(reg.background.StartLoop, errNoHandlers, run)
}

// WaitCompletions waits until nothing of the outbox runs in the background
// (the completions that follow acknowledgements, resends of an order key's
// next record, inserts of publishes that returned early, the loops of
// closed routers' plugins), or ctx ends, whose error it returns. Call it
// after Router.Close returned, before the service exits.
func (r *Registry) WaitCompletions(ctx context.Context) error {
	for {
		busy := r.background.Busy()
		if busy == nil {
			return nil
		}
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
