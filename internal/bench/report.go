package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// report is the table of one section of the run and the targets it checks.
type report struct {
	rows    []row
	targets []target
	// ratios are comparisons with no target: what the project is measured
	// against, not a line it must pass.
	ratios []target
	// costColumns are the database's cost columns, printed beside the rate
	// of every row that measured its cost.
	costColumns []costColumn
}

type row struct {
	group string
	name  string
	conc  string
	r     result
	unit  string
	// cols, when set, are the row's cost columns instead of the report's:
	// such rows make a table of their own.
	cols []costColumn
}

type target struct {
	what     string
	measured string
	met      bool
	why      string // set when the target does not apply
}

func (rep *report) add(group, name string, conc int, r result, unit string) {
	rep.addWith(nil, group, name, conc, r, unit)
}

// addWith adds a row whose cost is in columns of its own, cols.
func (rep *report) addWith(cols []costColumn, group, name string, conc int, r result, unit string) {
	c := ""
	if conc > 0 {
		c = fmt.Sprint(conc)
	}
	rep.rows = append(rep.rows, row{group: group, name: name, conc: c, r: r, unit: unit, cols: cols})
}

// ratio checks got/base against want (at least want). A case that lost
// messages has no rate to compare.
func (rep *report) ratio(what string, got, base result, want float64) {
	if got.lost > 0 || base.lost > 0 {
		rep.notApplicable(what, "messages were lost")
		return
	}
	r := got.rate / base.rate
	rep.targets = append(rep.targets, target{
		what:     what,
		measured: fmt.Sprintf("%.2f× (%s / %s)", r, rate(got.rate), rate(base.rate)),
		met:      r >= want,
	})
}

// atMost checks a measured figure against a ceiling.
func (rep *report) atMost(what string, got, limit float64, format string) {
	rep.targets = append(rep.targets, target{what: what, measured: fmt.Sprintf(format, got), met: got <= limit})
}

// atLeast checks a measured figure against a floor.
func (rep *report) atLeast(what string, got, floor float64, format string) {
	rep.targets = append(rep.targets, target{what: what, measured: fmt.Sprintf(format, got), met: got >= floor})
}

// compare reports got/base with no target.
func (rep *report) compare(what string, got, base result) {
	if got.lost > 0 || base.lost > 0 {
		rep.compareNotApplicable(what, "messages were lost")
		return
	}
	rep.ratios = append(rep.ratios, target{what: what, measured: fmt.Sprintf("%.2f× (%s / %s)", got.rate/base.rate, rate(got.rate), rate(base.rate))})
}

// compareCost reports got/base of a cost per message (key of
// result.cost: "cpu", "wal") with no target: below 1 when got costs less.
func (rep *report) compareCost(what, key string, got, base result) {
	if got.cost[key] <= 0 || base.cost[key] <= 0 {
		rep.compareNotApplicable(what, "the cost was not measured")
		return
	}
	rep.ratios = append(rep.ratios, target{what: what, measured: fmt.Sprintf("%.2f× (%.3f / %.3f)", got.cost[key]/base.cost[key], got.cost[key], base.cost[key])})
}

// compareLatency reports got/base of two latencies with no target: above 1
// when got is slower.
func (rep *report) compareLatency(what string, got, base time.Duration) {
	if got <= 0 || base <= 0 {
		rep.compareNotApplicable(what, "a latency was not measured")
		return
	}
	rep.ratios = append(rep.ratios, target{what: what, measured: fmt.Sprintf("%.2f× (%s / %s)", float64(got)/float64(base), ms(got), ms(base))})
}

func (rep *report) compareNotApplicable(what, why string) {
	rep.ratios = append(rep.ratios, target{what: what, why: why})
}

func (rep *report) notApplicable(what, why string) {
	rep.targets = append(rep.targets, target{what: what, why: why})
}

// note is a row's note with its losses and failures.
func (r row) note() string {
	note := r.r.note
	if r.r.lost > 0 {
		note = strings.TrimSpace(fmt.Sprintf("%s *%d published message(s) never delivered*", note, r.r.lost))
	}
	if r.r.errors > 0 {
		note = strings.TrimSpace(fmt.Sprintf("%s %d failed calls, first: %v", note, r.r.errors, r.r.firstErr))
	}
	return note
}

func (rep *report) print(w io.Writer) {
	var plain, costed []row
	for _, r := range rep.rows {
		if r.r.cost != nil {
			costed = append(costed, r)
		} else {
			plain = append(plain, r)
		}
	}
	if len(plain) > 0 {
		fmt.Fprintln(w, "| group | case | conc. | rate | p50 | p99 | note |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|---|")
		for _, r := range plain {
			p50, p99 := "", ""
			if r.r.latency {
				p50, p99 = ms(r.r.p50), ms(r.r.p99)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s %s | %s | %s | %s |\n", r.group, r.name, r.conc, rate(r.r.rate), r.unit, p50, p99, r.note())
		}
		fmt.Fprintln(w)
	}
	// One table per set of cost columns, in the order the rows came.
	for len(costed) > 0 {
		cols := costed[0].columns(rep)
		var same, rest []row
		for _, r := range costed {
			if slices.Equal(r.columns(rep), cols) {
				same = append(same, r)
			} else {
				rest = append(rest, r)
			}
		}
		costed = rest
		head, align := "| group | case | conc. | rate |", "|---|---|--:|--:|"
		for _, c := range cols {
			head += " " + c.title + " |"
			align += "--:|"
		}
		fmt.Fprintln(w, head+" note |")
		fmt.Fprintln(w, align+"---|")
		for _, r := range same {
			note := r.note()
			if paths := pathNote(r.r.cost); paths != "" {
				note = strings.TrimPrefix(note+"; "+paths, "; ")
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s %s | %s | %s |\n", r.group, r.name, r.conc, rate(r.r.rate), r.unit,
				strings.Join(costCells(cols, r.r.cost), " | "), note)
		}
		fmt.Fprintln(w)
	}
	if len(rep.ratios) > 0 {
		fmt.Fprintln(w, "| ratio | measured |")
		fmt.Fprintln(w, "|---|---|")
		for _, t := range rep.ratios {
			if t.why != "" {
				fmt.Fprintf(w, "| %s | n/a: %s |\n", t.what, t.why)
			} else {
				fmt.Fprintf(w, "| %s | %s |\n", t.what, t.measured)
			}
		}
		fmt.Fprintln(w)
	}
	if len(rep.targets) > 0 {
		fmt.Fprintln(w, "| target | measured | met |")
		fmt.Fprintln(w, "|---|---|---|")
		for _, t := range rep.targets {
			switch {
			case t.why != "":
				fmt.Fprintf(w, "| %s | — | n/a: %s |\n", t.what, t.why)
			case t.met:
				fmt.Fprintf(w, "| %s | %s | met |\n", t.what, t.measured)
			default:
				fmt.Fprintf(w, "| %s | %s | *not met* |\n", t.what, t.measured)
			}
		}
	}
}

// columns are the row's cost columns.
func (r row) columns(rep *report) []costColumn {
	if r.cols != nil {
		return r.cols
	}
	return rep.costColumns
}

func rate(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

const mib = 1 << 20
