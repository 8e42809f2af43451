package outbox

import (
	"fmt"
	"sort"
	"sync/atomic"
)

// Tracked names one tracked topic and the store its records are saved into.
type Tracked struct {
	// Name is the topic messages are published to. It is also stamped into
	// the metadata ([MetadataName]) so that the receiver finds the store.
	Name string
	// Store saves the records of this name. Several names may share a store.
	Store Store
}

// Registry names the tracked topics and the store each one saves into. It is
// built once and read without locks; an untracked topic costs one map lookup.
type Registry struct {
	enabled bool
	byName  map[string]Store
	names   []string
	obs     atomic.Pointer[observerBox]
}

// NewRegistry builds a registry of the tracked names. Names must be non-empty
// and unique, and each must have a store.
//
// Inside a Go test binary the registry tracks nothing unless the environment
// variable named by [EnvToggle] is "on" at this call; see the package
// documentation.
func NewRegistry(tracked ...Tracked) (*Registry, error) {
	r := &Registry{enabled: trackingEnabled(), byName: make(map[string]Store, len(tracked))}
	for i, t := range tracked {
		if t.Name == "" {
			return nil, fmt.Errorf("%w: tracked name #%d is empty", ErrInvalidConfig, i)
		}
		if t.Store == nil {
			return nil, fmt.Errorf("%w: tracked name %q has no store", ErrInvalidConfig, t.Name)
		}
		if _, dup := r.byName[t.Name]; dup {
			return nil, fmt.Errorf("%w: tracked name %q registered twice", ErrInvalidConfig, t.Name)
		}
		r.byName[t.Name] = t.Store
		r.names = append(r.names, t.Name)
	}
	sort.Strings(r.names)
	if !r.enabled {
		// A test binary without the toggle: nothing is tracked, every lookup
		// misses, and the publisher, middleware and replay pass through.
		r.byName = nil
	}
	return r, nil
}

// Enabled reports whether the registry tracks messages; false only inside a
// test binary without the toggle.
func (r *Registry) Enabled() bool { return r.enabled }

// Names returns the tracked names, sorted.
func (r *Registry) Names() []string { return append([]string(nil), r.names...) }

// Store returns the store of a tracked name, or nil when the name is not
// tracked (or tracking is off).
func (r *Registry) Store(name string) Store { return r.byName[name] }
