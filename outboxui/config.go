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
	// through outboxops.RetireConsumer, which refuses a topic the registry
	// does not track and a consumer the topic still declares, and its
	// remote consumers are shown as such. Defaults to nil: the store
	// refuses only a consumer that its topic's latest start declared
	// (outboxctl serve, which has no registry, works so).
	Registry *outbox.Registry

	// AllowedHosts, when set, are the Host values the dashboard answers,
	// as a browser sends them: a name or an address, with the port when
	// the address has one ("localhost:8080", "[::1]:8080",
	// "outbox.example.com"), compared without regard to case. A request
	// with another Host gets 421 Misdirected Request, reads included, and
	// an action whose Origin is not one of them is refused: a page of
	// another site whose name its owner resolves to this server (DNS
	// rebinding) can then neither read the pages, their payloads and
	// action token, nor act. Set it whenever a browser reaches the
	// dashboard without a proxy that checks the Host; [Handler.Guard]
	// applies the same check to the server's other handlers. Defaults to
	// none: every Host is answered, and an action's Origin is compared
	// with the request's own Host, which such a page chooses.
	AllowedHosts []string

	// Authorize, when set, is called on every request before anything is
	// read; a non-nil error refuses it with 403 Forbidden (the error is
	// logged, not shown). Use it for what the service's authentication
	// middleware does not check, such as an operator's role. Defaults to
	// nil: every request that reaches the handler is served.
	Authorize func(*http.Request) error

	// Inbox, when set, is the service's inbox: the inbox page lists its
	// latest entries, PageSize of them, each with its consumer and the
	// sender's identity (Source) and record. Defaults to nil: no inbox
	// page.
	Inbox *sqlstore.Inbox

	// PageSize is how many records a page of the records list shows, and
	// entries the inbox page, 1 to 500. Defaults to 50.
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
	_, err := parseHosts(c.AllowedHosts)
	return err
}
