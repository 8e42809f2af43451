package outboxui

import (
	"fmt"
	"html/template"
	"time"

	"github.com/wmoutbox/outbox/sqlstore"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"age":      age,
	"lastSeen": lastSeen,
	"pct":      pct,
	"list": func(topic, consumer, state string) template.URL {
		return recordsURL(sqlstore.RecordFilter{Topic: topic, Consumer: consumer, State: sqlstore.State(state)}, 0)
	},
}

// age writes a duration as an operator reads it: 0s, 42s, 5m10s, 3h02m,
// 2d04h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// lastSeen is when a receiver was last seen checking or confirming
// records, "never" when it never was.
func lastSeen(seen bool, since time.Duration) string {
	if !seen {
		return "never"
	}
	if since <= 0 {
		return "0s ago"
	}
	return age(since) + " ago"
}

// pct is part of all as a percentage, "–" when all is zero.
func pct(part, all int64) string {
	if all == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(all))
}
