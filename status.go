package outbox

import (
	"context"
	"encoding/json"
	"fmt"
)

// ReadStatus reports the records of every tracked name, in name order, from
// the stores that implement [StatusReader]; a name whose store does not is
// left out, and a name without records reports zeros. With full false it
// reads only pending records (Abandoned and Completed stay zero), which is
// cheap enough for frequent health checks and metric scrapes.
func ReadStatus(ctx context.Context, reg *Registry, full bool) ([]NameStatus, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", ErrInvalidConfig)
	}
	found := map[string]NameStatus{}
	for _, t := range reg.stores() {
		name := t.name
		sr, ok := t.store.(StatusReader)
		if !ok {
			continue
		}
		var sts []NameStatus
		var err error
		if full {
			sts, err = sr.Status(ctx)
		} else {
			sts, err = sr.PendingStatus(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("outbox: reading the status of %q: %w", name, err)
		}
		for _, st := range sts {
			found[st.Name] = st
		}
	}
	out := make([]NameStatus, 0, len(reg.names))
	for _, t := range reg.entries() {
		if _, ok := t.store.(StatusReader); !ok {
			continue
		}
		st := found[t.name]
		st.Name = t.name
		out = append(out, st)
	}
	return out, nil
}

// MarshalJSON writes the status with snake_case keys and the oldest pending
// age in seconds, as dashboards read it.
func (s NameStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name          string  `json:"name"`
		Pending       int64   `json:"pending"`
		OldestPending float64 `json:"oldest_pending_seconds"`
		Abandoned     int64   `json:"abandoned"`
		Completed     int64   `json:"completed"`
	}{s.Name, s.Pending, s.OldestPending.Seconds(), s.Abandoned, s.Completed})
}
