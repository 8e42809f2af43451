package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wmoutbox/outbox/sqlstore"
)

// recordJSON is a record as --json prints it.
type recordJSON struct {
	ID              int64             `json:"id"`
	Name            string            `json:"name"`
	UUID            string            `json:"uuid"`
	State           string            `json:"state"`
	Attempts        int               `json:"attempts"`
	LastError       string            `json:"last_error,omitempty"`
	AgeSeconds      float64           `json:"age_seconds"`
	LastSentSecsAgo float64           `json:"last_sent_seconds_ago"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Payload         string            `json:"payload,omitempty"`
	PayloadIsBase64 bool              `json:"payload_base64,omitempty"`
	Deliveries      []deliveryJSON    `json:"deliveries,omitempty"`
}

// deliveryJSON is one consumer's delivery of a record, as --json prints it.
type deliveryJSON struct {
	Consumer  string `json:"consumer"`
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

func toJSON(r sqlstore.RecordInfo, full bool) recordJSON {
	j := recordJSON{ID: r.ID, Name: r.Topic, UUID: r.UUID, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError,
		AgeSeconds: r.Age.Seconds(), LastSentSecsAgo: r.SinceSent.Seconds()}
	for _, d := range r.Deliveries {
		j.Deliveries = append(j.Deliveries, deliveryJSON{Consumer: d.Consumer, State: string(d.State), Attempts: d.Attempts, LastError: d.LastError})
	}
	if full {
		j.Metadata = r.Metadata
		if utf8.Valid(r.Payload) {
			j.Payload = string(r.Payload)
		} else {
			j.Payload, j.PayloadIsBase64 = base64Of(r.Payload), true
		}
	}
	return j
}

// deliveriesLine summarizes the per-consumer deliveries of a record for a
// table row: "billing=completed shipping=pending(2)"; "-" when it has none.
func deliveriesLine(ds []sqlstore.DeliveryInfo) string {
	if len(ds) == 0 {
		return "-"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Consumer + "=" + string(d.State)
		if d.Attempts > 0 {
			parts[i] += fmt.Sprintf("(%d)", d.Attempts)
		}
	}
	return strings.Join(parts, " ")
}

// age prints a duration rounded for people.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// pendingTotal counts the pending records, for the progress bar; 0 when
// the status cannot be read (the bar then counts without a total).
func pendingTotal(ctx context.Context, s *sqlstore.Store) int64 {
	sts, err := s.Status(ctx)
	if err != nil {
		return 0
	}
	total := int64(0)
	for _, st := range sts {
		total += st.Pending
	}
	return total
}

// progress draws a one-line bar on w.
type progress struct {
	w     io.Writer
	total int64
}

func newProgress(w io.Writer, total int64) *progress { return &progress{w: w, total: total} }

func (p *progress) set(done int64) {
	if p.total <= 0 {
		fmt.Fprintf(p.w, "\r%d", done)
		return
	}
	const width = 30
	filled := int(min(done, p.total) * width / p.total)
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, p.total)
}

func (p *progress) finish() { fmt.Fprintln(p.w) }

func base64Of(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
