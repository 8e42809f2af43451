package outboxui

import (
	"fmt"
	"net/http"
	"time"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// Config configures the dashboard. The zero value shows every page, with
// no action and no authorisation of its own.
type Config struct {
	// Actions turns on the pages' actions: requeue an abandoned record,
	// make a pending record due, retire a consumer. Defaults to false: the
	// pages only read, and every action is refused.
	Actions bool

	// Registry, when set, is the service's: retiring a consumer goes
	// through outbox.RetireConsumer, which refuses a topic the registry
	// does not track and a consumer the topic still declares, and its
	// remote consumers are shown as such. Defaults to nil: the store
	// refuses only a consumer that its topic's latest start declared
	// (outboxctl serve, which has no registry, works so).
	Registry *outbox.Registry

	// Authorize, when set, is called on every request before anything is
	// read; a non-nil error refuses it with 403 Forbidden (the error is
	// logged, not shown). Use it for what the service's authentication
	// middleware does not check, such as an operator's role. Defaults to
	// nil: every request that reaches the handler is served.
	Authorize func(*http.Request) error

	// PageSize is how many records a page of the records list shows, 1 to
	// 500. Defaults to 50.
	PageSize int

	// PayloadLimit is how many bytes of a payload a record's page shows,
	// at least 16. Defaults to 4096.
	PayloadLimit int

	// Timeout bounds the database reads and writes of one request.
	// Defaults to 10s.
	Timeout time.Duration
}

func (c *Config) setDefaults() {
	if c.PageSize == 0 {
		c.PageSize = 50
	}
	if c.PayloadLimit == 0 {
		c.PayloadLimit = 4096
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
}

// Validate reports an error wrapping [sqlstore.ErrInvalidConfig] for a
// field out of its range. New calls it after setting the defaults.
func (c Config) Validate() error {
	switch {
	case c.PageSize < 1 || c.PageSize > 500:
		return fmt.Errorf("%w: outboxui: PageSize %d is not between 1 and 500", sqlstore.ErrInvalidConfig, c.PageSize)
	case c.PayloadLimit < 16:
		return fmt.Errorf("%w: outboxui: PayloadLimit %d is below 16", sqlstore.ErrInvalidConfig, c.PayloadLimit)
	case c.Timeout < 0:
		return fmt.Errorf("%w: outboxui: Timeout %v is negative", sqlstore.ErrInvalidConfig, c.Timeout)
	}
	return nil
}
