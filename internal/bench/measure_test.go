package main

import "testing"

// TestMedianTakesEachCostsOwnMiddle: the run chosen is the one in the
// middle by rate, and each cost is the middle of the runs' own, whichever
// run it came from.
func TestMedianTakesEachCostsOwnMiddle(t *testing.T) {
	rs := []result{
		{rate: 300, cost: map[string]float64{"cpu": 0.30, "wal": 400}},
		{rate: 100, cost: map[string]float64{"cpu": 0.10, "wal": 600}},
		{rate: 200, cost: map[string]float64{"cpu": 0.90, "wal": 500}},
	}
	m := median(rs, byRate)
	if m.rate != 200 {
		t.Errorf("rate %v, want the middle run's 200", m.rate)
	}
	if m.cost["cpu"] != 0.30 || m.cost["wal"] != 500 {
		t.Errorf("costs %v, want cpu 0.30 (the middle of 0.10, 0.30, 0.90) and wal 500", m.cost)
	}
	if got := median([]result{{rate: 1}}, byRate); got.cost != nil {
		t.Errorf("a run without costs got %v", got.cost)
	}
}
