package outboxui

import (
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/outboxops"
	"github.com/wmoutbox/outbox/recordstore"
)

// retireData is the page of a retire: the question, with what it would
// complete, before it acts; the refusal when it would not; the count it
// completed once it acted.
type retireData struct {
	Topic, Consumer string
	// Status is the consumer's pending deliveries and when it was last
	// seen, as the question shows them.
	Status recordstore.ConsumerStatus
	// Refused says why the consumer cannot be retired; Declared is the
	// store's refusal, which says when the latest start declared it.
	Refused  string
	Declared *recordstore.ConsumerDeclaredError
	// Done is set once it acted, Completed the deliveries it completed.
	Done      bool
	Completed int
}

// notRetiredByRegistry is the refusal of the service's registry.
const notRetiredByRegistry = "The service's registry does not track this topic, or its topic still declares this consumer: remove it from the topic's consumers first."

// retire asks before it acts: a form without "confirm" gets the page that
// shows how many pending deliveries the retire would complete and when the
// consumer was last seen, with a form that confirms; the confirmed form
// completes them and gets the page with the count.
func (h *Handler) retire(w http.ResponseWriter, r *http.Request, fields watermill.LogFields) {
	d := retireData{Topic: r.PostFormValue("topic"), Consumer: r.PostFormValue("consumer")}
	if d.Topic == "" || d.Consumer == "" {
		h.message(w, http.StatusBadRequest, "Bad request", "Retiring needs a topic and a consumer.")
		return
	}
	fields["topic"], fields["consumer"] = d.Topic, d.Consumer
	ctx, cancel := h.ctx(r)
	defer cancel()
	if r.PostFormValue("confirm") != "yes" {
		h.askRetire(ctx, w, r, d)
		return
	}
	var err error
	if h.cfg.Registry != nil {
		d.Completed, err = outboxops.RetireConsumer(ctx, h.cfg.Registry, d.Topic, d.Consumer)
	} else {
		d.Completed, err = h.store.Retire(ctx, d.Topic, d.Consumer)
	}
	fields["completed"] = d.Completed
	switch {
	case errors.As(err, &d.Declared):
	case errors.Is(err, outbox.ErrInvalidConfig):
		d.Refused = notRetiredByRegistry
	case err != nil:
		h.fail(w, r, err)
		return
	default:
		d.Done = true
		h.logger.Info("outboxui: consumer retired", fields)
		h.render(w, http.StatusOK, "retire", page{Title: "Retired " + d.Consumer, Data: d})
		return
	}
	h.logger.Info("outboxui: retire refused", watermill.LogFields{"topic": d.Topic, "consumer": d.Consumer, "reason": err.Error()})
	h.render(w, http.StatusConflict, "retire", page{Title: "Not retired", Data: d})
}

// askRetire renders the question, or the refusal that the retire would
// meet.
func (h *Handler) askRetire(ctx context.Context, w http.ResponseWriter, r *http.Request, d retireData) {
	if reg := h.cfg.Registry; reg != nil && (reg.Store(d.Topic) == nil ||
		slices.Contains(reg.Consumers(d.Topic), d.Consumer) || slices.Contains(reg.RemoteConsumers(d.Topic), d.Consumer)) {
		d.Refused = notRetiredByRegistry
	}
	if err := h.ops.CheckRetire(ctx, d.Topic, d.Consumer); !errors.As(err, &d.Declared) && err != nil {
		h.fail(w, r, err)
		return
	}
	sts, err := h.store.PendingStatus(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d.Status.Consumer = d.Consumer
	for _, st := range sts {
		if st.Topic != d.Topic {
			continue
		}
		if i := slices.IndexFunc(st.Consumers, func(c recordstore.ConsumerStatus) bool { return c.Consumer == d.Consumer }); i >= 0 {
			d.Status = st.Consumers[i]
		}
	}
	status := http.StatusOK
	if d.Refused != "" || d.Declared != nil {
		status = http.StatusConflict
	}
	h.render(w, status, "retire", page{Title: "Retire " + d.Consumer + "?", Data: d})
}
