package outboxui

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/sqlstore"
)

//go:embed templates/*.html templates/style.css
var assets embed.FS

// Handler is the dashboard, an [http.Handler]; see the package doc for its
// pages. Mount it with [http.StripPrefix] under a path of its own: its
// links are relative to that path.
type Handler struct {
	store  *sqlstore.Store
	ops    *sqlstore.Operator
	cfg    Config
	logger watermill.LoggerAdapter
	// token is the secret of this process that every action's form
	// carries.
	token string
	cop   *http.CrossOriginProtection
	hosts hosts
	pages map[string]*template.Template
	css   []byte
	mux   *http.ServeMux
}

// New returns the dashboard of the store. A nil logger logs nothing; the
// actions and the errors are logged through it.
func New(store *sqlstore.Store, cfg Config, logger watermill.LoggerAdapter) (*Handler, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: outboxui: store is nil", sqlstore.ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("outboxui: making the action token: %w", err)
	}
	h := &Handler{store: store, ops: store.Operator(), cfg: cfg, logger: logger, token: hex.EncodeToString(secret), cop: http.NewCrossOriginProtection()}
	var err error
	if h.hosts, err = parseHosts(cfg.AllowedHosts); err != nil {
		return nil, err
	}
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if h.css, err = assets.ReadFile("templates/style.css"); err != nil {
		return nil, fmt.Errorf("outboxui: reading the style sheet: %w", err)
	}
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /records", h.records)
	h.mux.HandleFunc("GET /record", h.record)
	h.mux.HandleFunc("GET /inbox", h.inbox)
	h.mux.HandleFunc("GET /style.css", h.style)
	h.mux.HandleFunc("POST /requeue", h.action(h.recordAction("requeued", h.requeue)))
	h.mux.HandleFunc("POST /due", h.action(h.recordAction("due", h.makeDue)))
	h.mux.HandleFunc("POST /retire", h.action(h.retire))
	return h, nil
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "records", "record", "inbox", "retire", "message"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("outboxui: parsing page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// ServeHTTP implements [http.Handler].
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.misdirected(w, r) {
		return
	}
	if h.cfg.Authorize != nil {
		if err := h.cfg.Authorize(r); err != nil {
			h.logger.Info("outboxui: request refused by Authorize", watermill.LogFields{"path": r.URL.Path, "remote": r.RemoteAddr, "reason": err.Error()})
			h.message(w, http.StatusForbidden, "Forbidden", "You are not allowed to see this page.")
			return
		}
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "same-origin")
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) style(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=3600")
	_, _ = w.Write(h.css)
}

// ctx bounds a request's database work by Config.Timeout.
func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.Timeout)
}

// page is what every page's layout reads.
type page struct {
	Title   string
	Actions bool
	// Inbox tells that the dashboard has an inbox page.
	Inbox  bool
	Token  string
	Notice string
	Data   any
}

func (h *Handler) render(w http.ResponseWriter, status int, name string, p page) {
	p.Actions, p.Token, p.Inbox = h.cfg.Actions, h.token, h.cfg.Inbox != nil
	var buf bytes.Buffer
	if err := h.pages[name].Execute(&buf, p); err != nil {
		h.logger.Error("outboxui: rendering page", err, watermill.LogFields{"page": name})
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

type messageData struct{ Heading, Text string }

func (h *Handler) message(w http.ResponseWriter, status int, heading, text string) {
	h.render(w, status, "message", page{Title: heading, Data: messageData{heading, text}})
}

// fail logs a store error with its detail and shows a generic message: the
// detail may name tables, hosts or values.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, sqlstore.ErrRecordNotFound) {
		h.message(w, http.StatusNotFound, "Not found", "There is no record with this id.")
		return
	}
	h.logger.Error("outboxui: request failed", err, watermill.LogFields{"path": r.URL.Path})
	h.message(w, http.StatusInternalServerError, "Something went wrong",
		"The outbox store could not answer. The service's log has the detail.")
}
