package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// recordJSON is a record as -json prints it.
type recordJSON struct {
	ID         int64   `json:"id"`
	Topic      string  `json:"topic"`
	UUID       string  `json:"uuid"`
	State      string  `json:"state"`
	Attempts   int     `json:"attempts"`
	LastError  string  `json:"last_error,omitempty"`
	AgeSeconds float64 `json:"age_seconds"`
	// LastSentSecsAgo is absent when the record is due: made due by
	// outboxctl due or a requeue, its send time says nothing.
	LastSentSecsAgo *float64          `json:"last_sent_seconds_ago,omitempty"`
	Resent          bool              `json:"resent"`
	Due             bool              `json:"due"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Payload         string            `json:"payload,omitempty"`
	PayloadIsBase64 bool              `json:"payload_base64,omitempty"`
	Deliveries      []deliveryJSON    `json:"deliveries,omitempty"`
}

// deliveryJSON is one consumer's delivery of a record, as -json prints it.
type deliveryJSON struct {
	Consumer  string `json:"consumer"`
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// listJSON is a page of records; NextAfter is the -after of the next page
// when there are more.
type listJSON struct {
	Records   []recordJSON `json:"records"`
	More      bool         `json:"more"`
	NextAfter int64        `json:"next_after,omitempty"`
}

// statusJSON is the status of a table as -json prints it: each topic as
// the status handler writes it (recordstore.TopicStatus.MarshalJSON).
type statusJSON struct {
	Table      string                    `json:"table"`
	Completion string                    `json:"completion"`
	Topics     []recordstore.TopicStatus `json:"topics"`
}

// lastSeen is a LAST SEEN column: when a receiver of the topic, or the
// consumer, was last seen checking or confirming its records.
func lastSeen(seen bool, since time.Duration) string {
	if !seen {
		return "never"
	}
	return age(since) + " ago"
}

func toJSON(r recordstore.RecordInfo, full bool) recordJSON {
	j := recordJSON{ID: r.ID, Topic: r.Topic, UUID: r.UUID, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError,
		AgeSeconds: r.Age.Seconds(), Resent: r.Resent, Due: r.Due}
	if !r.Due {
		sent := r.SinceSent.Seconds()
		j.LastSentSecsAgo = &sent
	}
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

// resent is the RESENT column of a record: when it was last sent again
// after the publish that saved it.
func resent(r recordstore.RecordInfo) string {
	switch {
	case r.Due:
		return "due now"
	case !r.Resent:
		return "never"
	default:
		return age(r.SinceSent) + " ago"
	}
}

// lastSent says when, and by what, a record was last sent.
func lastSent(r recordstore.RecordInfo) string {
	switch {
	case r.Due:
		return "due now (made due by outboxctl due or requeue)"
	case !r.Resent:
		return age(r.SinceSent) + " ago, by the publish that saved it"
	default:
		return age(r.SinceSent) + " ago, resent"
	}
}

// attemptsAndError are a list row's ATTEMPTS and LAST ERROR: the record's
// own, or for a record with deliveries the most attempts of one of them
// and the last error of the one that failed most.
func attemptsAndError(r recordstore.RecordInfo) (int, string) {
	attempts, lastError := r.Attempts, r.LastError
	for _, d := range r.Deliveries {
		if d.Attempts > attempts || (d.Attempts == attempts && lastError == "") {
			attempts = d.Attempts
			if d.LastError != "" {
				lastError = d.LastError
			}
		}
	}
	return attempts, lastError
}

// deliveriesLine summarizes the per-consumer deliveries of a record for a
// table row: "billing=completed shipping=pending(2)"; "-" when it has none.
func deliveriesLine(ds []recordstore.DeliveryInfo) string {
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

// progress draws a one-line count and rate on w while a long operation
// runs, and the bar against total when it is known; it draws nothing when
// w is not a terminal, so that scripts and logs get only the result.
type progress struct {
	w      io.Writer
	total  int64
	start  time.Time
	drawn  bool
	active bool
}

func newProgress(w io.Writer, total int64) *progress {
	return &progress{w: w, total: total, start: time.Now(), active: isTerminal(w)}
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (p *progress) set(done int64) {
	if !p.active {
		return
	}
	p.drawn = true
	fmt.Fprint(p.w, "\r"+progressLine(done, p.total, time.Since(p.start)))
}

// progressLine is what set draws: the count, the bar when the total is
// known, and the rate.
func progressLine(done, total int64, elapsed time.Duration) string {
	rate := ""
	if elapsed > 0 {
		rate = fmt.Sprintf(" %.0f/s", float64(done)/elapsed.Seconds())
	}
	if total <= 0 {
		return fmt.Sprintf("%d%s", done, rate)
	}
	const width = 30
	filled := int(min(done, total) * width / total)
	return fmt.Sprintf("[%s%s] %d/%d%s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, rate)
}

func (p *progress) finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

func base64Of(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
