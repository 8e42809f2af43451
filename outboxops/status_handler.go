package outboxops

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox"
)

// StatusHandlerConfig configures [NewStatusHandler].
type StatusHandlerConfig struct {
	// MaxPendingAge makes the status unhealthy when a tracked topic's oldest
	// pending record is older than this. Defaults to 15 minutes.
	MaxPendingAge time.Duration
	// Full adds the abandoned and completed counts, which read the whole
	// table; leave it off for frequent health checks. Defaults to false.
	Full bool
	// Timeout bounds the reading of the status. Defaults to 5 seconds.
	Timeout time.Duration
}

func (c *StatusHandlerConfig) setDefaults() {
	if c.MaxPendingAge == 0 {
		c.MaxPendingAge = 15 * time.Minute
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
}

// Validate reports a configuration error, if any.
func (c StatusHandlerConfig) Validate() error {
	if c.MaxPendingAge < 0 || c.Timeout < 0 {
		return fmt.Errorf("%w: MaxPendingAge %v and Timeout %v must not be negative", outbox.ErrInvalidConfig, c.MaxPendingAge, c.Timeout)
	}
	return nil
}

// StatusReport is what the status handler serves.
type StatusReport struct {
	// Healthy is false when a store could not be read or a name's oldest
	// pending record is older than MaxPendingAge. A topic whose records
	// wait for a receiver never seen ([TopicStatus.Unchecked] > 0) becomes
	// unhealthy by the same rule once they are older than MaxPendingAge,
	// and not before: a receiver just deployed has not checked yet.
	Healthy bool `json:"healthy"`
	// Error says that the stores could not be read, if they could not. It
	// names no table, database or address, which the handler may not show
	// to whoever asks: the cause is logged.
	Error  string        `json:"error,omitempty"`
	Topics []TopicStatus `json:"topics"`
}

// statusReadFailed is the report's error when a store could not be read.
const statusReadFailed = "reading the outbox status failed; the cause is in the service's log"

// NewStatusHandler returns an http.Handler that serves the [StatusReport] of
// the registry's topics as JSON, with status 200 when healthy and 503 when
// not, for dashboards and health checks. It serves the topic names and
// their backlog to whoever can reach it, so mount it behind the service's
// authentication or on an internal port; a failure to read a store is
// logged with its cause and answered with a generic error.
func NewStatusHandler(reg *outbox.Registry, cfg StatusHandlerConfig, logger watermill.LoggerAdapter) (http.Handler, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registry is nil", outbox.ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &statusHandler{reg: reg, cfg: cfg, logger: logger}, nil
}

type statusHandler struct {
	reg    *outbox.Registry
	cfg    StatusHandlerConfig
	logger watermill.LoggerAdapter
}

func (h *statusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	report := StatusReport{Healthy: true, Topics: []TopicStatus{}}
	names, err := ReadStatus(ctx, h.reg, StatusOptions{Full: h.cfg.Full})
	if err != nil {
		h.logger.Error("Reading the outbox status failed", err, nil)
		report.Healthy, report.Error = false, statusReadFailed
	}
	for _, st := range names {
		if st.OldestPending > h.cfg.MaxPendingAge {
			report.Healthy = false
		}
		report.Topics = append(report.Topics, st)
	}
	w.Header().Set("Content-Type", "application/json")
	if !report.Healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(report)
}
