package outboxui

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// topicRow is one topic of the overview.
type topicRow struct {
	recordstore.TopicStatus
	Activity  sqlstore.Activity
	Consumers []consumerRow
	Chart     chart
	// Remote tells that a consumer of the topic is remote; Awaiting sums
	// the remote consumers' pending deliveries, which await their
	// confirmation, and AwaitingOldest is the age of the oldest of them.
	Remote         bool
	Awaiting       int64
	AwaitingOldest time.Duration
}

type consumerRow struct {
	recordstore.ConsumerStatus
	Topic     string
	Abandoned int64
}

type overviewData struct {
	Topics []topicRow
	Total  chart
	Window time.Duration
	// Completed, Resent and Failed sum the topics' last hour.
	Completed, Resent, Failed int64
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	status, err := h.store.PendingStatus(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	activity, err := h.ops.Activity(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	seen, err := h.ops.ConsumersSeen(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rows := map[string]*topicRow{}
	row := func(topic string) *topicRow {
		if rows[topic] == nil {
			rows[topic] = &topicRow{TopicStatus: recordstore.TopicStatus{Topic: topic}}
		}
		return rows[topic]
	}
	for _, st := range status {
		row(st.Topic).TopicStatus = st
	}
	d := overviewData{Window: sqlstore.ActivityWindow}
	var total []int64
	for _, a := range activity {
		t := row(a.Topic)
		t.Activity, t.Abandoned = a, a.Abandoned
		d.Completed, d.Resent, d.Failed = d.Completed+a.Completed, d.Resent+a.Resent, d.Failed+a.Failed
		if total == nil {
			total = make([]int64, len(a.Backlog))
		}
		for i, n := range a.Backlog {
			total[i] += n
		}
	}
	for _, t := range rows {
		listed := map[string]bool{}
		for _, c := range t.TopicStatus.Consumers {
			listed[c.Consumer] = true
			if reg := h.cfg.Registry; reg != nil && slices.Contains(reg.RemoteConsumers(t.Topic), c.Consumer) {
				c.Remote = true
			}
			if c.Remote {
				t.Remote = true
				t.Awaiting += c.Pending
				t.AwaitingOldest = max(t.AwaitingOldest, c.OldestPending)
			}
			t.Consumers = append(t.Consumers, consumerRow{ConsumerStatus: c, Topic: t.Topic, Abandoned: t.Activity.AbandonedDeliveries[c.Consumer]})
		}
		for c, n := range t.Activity.AbandonedDeliveries {
			if !listed[c] {
				// Nothing pending: the status did not read when it
				// was last seen.
				cs := recordstore.ConsumerStatus{Consumer: c}
				cs.SinceSeen, cs.Seen = seen[t.Topic][c]
				t.Consumers = append(t.Consumers, consumerRow{ConsumerStatus: cs, Topic: t.Topic, Abandoned: n})
			}
		}
		slices.SortFunc(t.Consumers, func(a, b consumerRow) int { return cmp.Compare(a.Consumer, b.Consumer) })
		t.Chart = sparkline(t.Activity.Backlog)
		d.Topics = append(d.Topics, *t)
	}
	slices.SortFunc(d.Topics, func(a, b topicRow) int { return cmp.Compare(a.Topic, b.Topic) })
	d.Total = backlogChart(total)
	h.render(w, http.StatusOK, "overview", page{Title: "Outbox", Notice: notices[r.URL.Query().Get("done")], Data: d})
}

type recordsData struct {
	Filter  sqlstore.RecordFilter
	After   int64
	Records []recordstore.RecordInfo
	// Next is the address of the next page, "" on the last.
	Next template.URL
}

func (h *Handler) records(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := sqlstore.RecordFilter{Topic: q.Get("topic"), Consumer: q.Get("consumer"), State: sqlstore.State(q.Get("state"))}
	if f.State == "" {
		f.State = sqlstore.Pending
	}
	after, err := optionalID(q.Get("after"))
	if err != nil || f.Topic == "" || (f.State != sqlstore.Pending && f.State != sqlstore.Abandoned) {
		h.message(w, http.StatusBadRequest, "Bad request", "The records list needs a topic, a state (pending or abandoned) and a numeric after.")
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	recs, err := h.ops.List(ctx, f, after, h.cfg.PageSize, 0)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := recordsData{Filter: f, After: after, Records: recs}
	if len(recs) == h.cfg.PageSize {
		d.Next = recordsURL(f, recs[len(recs)-1].ID)
	}
	h.render(w, http.StatusOK, "records", page{Title: f.Topic + " · " + string(f.State), Data: d})
}

// recordsURL is the relative address of a page of the records list, which
// the templates take as it is (html/template would escape a query's "&"
// and "=" put in an href).
func recordsURL(f sqlstore.RecordFilter, after int64) template.URL {
	v := url.Values{"topic": {f.Topic}, "state": {string(f.State)}}
	if f.Consumer != "" {
		v.Set("consumer", f.Consumer)
	}
	if after > 0 {
		v.Set("after", strconv.FormatInt(after, 10))
	}
	return template.URL("records?" + v.Encode()) //nolint:gosec // built by url.Values from the request's own filter
}

func optionalID(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 0 {
		return 0, fmt.Errorf("not an id: %q", s)
	}
	return id, nil
}

type recordData struct {
	Record recordstore.RecordInfo
	Retry  sqlstore.RetryTimes
	// Payload is the payload shown, as text, or as a hex dump when
	// Binary; Cut tells that it was cut at Limit bytes of Size.
	Payload     string
	Binary, Cut bool
	Limit, Size int
}

func (h *Handler) record(w http.ResponseWriter, r *http.Request) {
	id, err := optionalID(r.URL.Query().Get("id"))
	if err != nil || id == 0 {
		h.message(w, http.StatusBadRequest, "Bad request", "A record's page needs its numeric id.")
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	rec, err := h.ops.Get(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	retry, err := h.ops.RetryDue(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := recordData{Record: rec, Retry: retry, Limit: h.cfg.PayloadLimit, Size: len(rec.Payload)}
	shown := rec.Payload
	if len(shown) > h.cfg.PayloadLimit {
		shown, d.Cut = shown[:h.cfg.PayloadLimit], true
	}
	if printable(shown) {
		d.Payload = string(shown)
	} else {
		d.Payload, d.Binary = hex.Dump(shown), true
	}
	h.render(w, http.StatusOK, "record", page{Title: fmt.Sprintf("Record %d", id), Notice: notices[r.URL.Query().Get("done")], Data: d})
}

// printable reports whether b reads as text: valid UTF-8 (a rune cut at
// the end is fine) with no control characters but white space.
func printable(b []byte) bool {
	for len(b) > 0 {
		c, n := utf8.DecodeRune(b)
		if c == utf8.RuneError && n <= 1 {
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if unicode.IsControl(c) && !unicode.IsSpace(c) {
			return false
		}
		b = b[n:]
	}
	return true
}
