package outbox

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// sharedSubscribers detects, at start, two handlers of a tracked topic that
// declares consumers subscribing through one subscriber value. Every
// broker but GoChannel gives the subscriptions of one subscriber one queue
// or consumer group (its configuration names it), so the handlers split the
// messages between them: each consumer gets about half, and every record
// stays pending for the other. Handlers in different processes that share a
// queue or group cannot be seen from here; docs/brokers.md says to give
// each consumer its own.
type sharedSubscribers struct {
	mu   sync.Mutex
	seen map[sharedKey]int
}

type sharedKey struct {
	topic string
	typ   reflect.Type
	ptr   uintptr
}

var goChannelType = reflect.TypeOf((*gochannel.GoChannel)(nil))

// maxUnwrap bounds the walk down a chain of subscriber wrappers.
const maxUnwrap = 8

// underlying is the subscriber under the wrappers a router puts around
// each handler's (Watermill's own context decorator, the outbox's and
// others' decorators): structs that hold the next subscriber in a field
// named sub or Subscriber. It returns the type and address of the first
// subscriber that is no such wrapper, or ok false when it is not a pointer.
func underlying(sub message.Subscriber) (reflect.Type, uintptr, bool) {
	v := reflect.ValueOf(sub)
	for range maxUnwrap {
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return nil, 0, false
		}
		next := v.Elem().FieldByName("sub")
		if !next.IsValid() {
			next = v.Elem().FieldByName("Subscriber")
		}
		if !next.IsValid() || next.Kind() != reflect.Interface || next.IsNil() {
			return v.Type(), v.Pointer(), true
		}
		v = next.Elem()
	}
	return nil, 0, false
}

// subscribed counts a subscription to a tracked topic with declared
// consumers, and logs the second one through the same subscriber.
func (s *sharedSubscribers) subscribed(t *tracked, sub message.Subscriber, logger watermill.LoggerAdapter) {
	if len(t.consumers) < 2 || sub == nil {
		return
	}
	typ, ptr, ok := underlying(sub)
	if !ok || typ == goChannelType {
		return // each Subscribe of a GoChannel gets every message
	}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[sharedKey]int{}
	}
	k := sharedKey{topic: t.topic, typ: typ, ptr: ptr}
	s.seen[k]++
	n := s.seen[k]
	s.mu.Unlock()
	if n == 2 {
		logger.Error("Two declared consumers of a tracked topic subscribe through one subscriber", fmt.Errorf(
			"%w: %d handlers of tracked topic %q, which declares consumers %q, subscribe through one %v; unless that pub/sub gives every subscription all messages, "+
				"they share its queue or consumer group and split the messages, and every record stays pending for the consumer that did not get it. "+
				"Give each consumer a subscriber of its own queue or group (docs/brokers.md)", ErrInvalidConfig, n, t.topic, t.consumers, typ),
			watermill.LogFields{"topic": t.topic})
	}
}
