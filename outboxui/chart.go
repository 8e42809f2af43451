package outboxui

import (
	"fmt"
	"strings"
	"time"

	"github.com/wmoutbox/outbox/sqlstore"
)

// chart is a line chart drawn server-side as inline SVG: no script, no
// asset.
type chart struct {
	Width, Height int
	// Points is the polyline's points attribute; Area the closed shape
	// under it.
	Points, Area string
	Max, Now     int64
	// ViewBox leaves room for the axis labels around the plot.
	ViewBox string
	// Ticks label the time axis.
	Ticks []tick
	Empty bool
}

type tick struct {
	X     int
	Label string
}

// backlogChart is the overview's chart of the total backlog.
func backlogChart(values []int64) chart {
	c := draw(values, 720, 160)
	c.ViewBox = fmt.Sprintf("-40 -10 %d %d", c.Width+50, c.Height+30)
	steps := len(values) - 1
	for m := 0; steps > 0 && m <= steps; m += 15 {
		ago := time.Duration(steps-m) * sqlstore.ActivityStep
		label := "now"
		if ago > 0 {
			label = fmt.Sprintf("-%dm", int(ago.Minutes()))
		}
		c.Ticks = append(c.Ticks, tick{X: m * c.Width / steps, Label: label})
	}
	return c
}

// sparkline is a topic's small chart.
func sparkline(values []int64) chart { return draw(values, 160, 28) }

func draw(values []int64, width, height int) chart {
	c := chart{Width: width, Height: height, Empty: true}
	if len(values) < 2 {
		return c
	}
	for _, v := range values {
		c.Max = max(c.Max, v)
	}
	c.Now = values[len(values)-1]
	c.Empty = c.Max == 0
	scale := max(c.Max, 1)
	var b strings.Builder
	for i, v := range values {
		x := float64(i) * float64(width) / float64(len(values)-1)
		y := float64(height) - float64(v)*float64(height-2)/float64(scale) - 1
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	c.Points = b.String()
	c.Area = fmt.Sprintf("0,%d %s %d,%d", height, c.Points, width, height)
	return c
}
