package outboxui

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/recordstore"
)

// action wraps an action's handler: it refuses the request when the
// actions are off, when it comes from another origin (with AllowedHosts,
// an Origin that is not one of them), and when its form lacks the
// process's token; it logs the refusals.
func (h *Handler) action(fn func(w http.ResponseWriter, r *http.Request, fields watermill.LogFields)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fields := watermill.LogFields{"action": r.URL.Path, "remote": r.RemoteAddr}
		if !h.cfg.Actions {
			h.logger.Info("outboxui: action refused: actions are off", fields)
			h.message(w, http.StatusForbidden, "Actions are off", "This dashboard only shows the records: the service did not turn its actions on.")
			return
		}
		if err := h.cop.Check(r); err != nil || !h.hosts.sameOrigin(r) {
			h.logger.Info("outboxui: action refused: cross-origin request", fields)
			h.message(w, http.StatusForbidden, "Forbidden", "The request came from another site.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
		if token := r.PostFormValue("csrf"); subtle.ConstantTimeCompare([]byte(token), []byte(h.token)) != 1 {
			h.logger.Info("outboxui: action refused: missing or wrong token", fields)
			h.message(w, http.StatusForbidden, "Forbidden", "The form is out of date or did not come from this dashboard: reload the page and try again.")
			return
		}
		fn(w, r, fields)
	}
}

// formID reads the form's record id, or answers 400.
func (h *Handler) formID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PostFormValue("id"), 10, 64)
	if err != nil || id < 1 {
		h.message(w, http.StatusBadRequest, "Bad request", "The action needs a numeric record id.")
		return 0, false
	}
	return id, true
}

// seeOther answers a done action with a redirect to a page, relative to the
// action's own path so that it works under any mount prefix (http.Redirect
// would make it absolute from the path left by http.StripPrefix).
func seeOther(w http.ResponseWriter, target string) {
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusSeeOther)
}

// notices are the lines a page shows after an action, by the "done" of
// its query: fixed texts, so that a link cannot make the page say
// anything else.
var notices = map[string]string{
	"requeued": "Requeued: pending again, due at once for the service's stale resubmitter.",
	"due":      "Made due: the service's stale resubmitter sends it at its next round.",
}

func recordPage(id int64, done string) string {
	return "record?" + url.Values{"id": {strconv.FormatInt(id, 10)}, "done": {done}}.Encode()
}

// conflict is the error of a record action on a record that is not in the
// state it needs: shown, not logged as a failure.
type conflict struct{ heading, text string }

func (c *conflict) Error() string { return c.text }

// recordAction is an action on the record of the form's id: act changes it
// and returns nil, a *conflict, or another error; done names the notice
// of the record's page and the log line.
func (h *Handler) recordAction(done string, act func(ctx context.Context, id int64) error) func(http.ResponseWriter, *http.Request, watermill.LogFields) {
	return func(w http.ResponseWriter, r *http.Request, fields watermill.LogFields) {
		id, ok := h.formID(w, r)
		if !ok {
			return
		}
		fields["record_id"] = id
		ctx, cancel := h.ctx(r)
		defer cancel()
		var c *conflict
		switch err := act(ctx, id); {
		case errors.As(err, &c):
			h.message(w, http.StatusConflict, c.heading, c.text)
			return
		case err != nil:
			h.fail(w, r, err)
			return
		}
		h.logger.Info("outboxui: record "+done, fields)
		seeOther(w, recordPage(id, done))
	}
}

func (h *Handler) requeue(ctx context.Context, id int64) error {
	err := h.ops.RequeueLater(ctx, id)
	if errors.Is(err, recordstore.ErrNotAbandoned) {
		return &conflict{"Not abandoned", "The record is not abandoned (any more): nothing was changed."}
	}
	return err
}

func (h *Handler) makeDue(ctx context.Context, id int64) error {
	pending, err := h.ops.MakeRecordDue(ctx, id)
	if err == nil && !pending {
		return &conflict{"Not pending", "The record is not pending (any more): nothing was changed."}
	}
	return err
}
