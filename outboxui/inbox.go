package outboxui

import (
	"net/http"

	"github.com/wmoutbox/outbox/sqlstore"
)

type inboxData struct {
	Table   string
	Entries []sqlstore.InboxEntryInfo
	Limit   int
}

// inbox lists the latest entries of the service's inbox: which consumer
// handled which message, sent by which service's record.
func (h *Handler) inbox(w http.ResponseWriter, r *http.Request) {
	in := h.cfg.Inbox
	if in == nil {
		h.message(w, http.StatusNotFound, "No inbox", "This dashboard was not given the service's inbox (Config.Inbox).")
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	entries, err := in.Recent(ctx, h.cfg.PageSize)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, http.StatusOK, "inbox", page{Title: "Inbox", Data: inboxData{Table: in.Table(), Entries: entries, Limit: h.cfg.PageSize}})
}
