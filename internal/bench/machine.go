package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// machine is what the figures were measured on.
type machine struct {
	cpu    string
	cores  int
	goVer  string
	osArch string
	load   string
}

func describeMachine() machine {
	return machine{
		cpu:    cpuModel(),
		cores:  runtime.NumCPU(),
		goVer:  runtime.Version(),
		osArch: runtime.GOOS + "/" + runtime.GOARCH,
		load:   loadAverage(),
	}
}

func (m machine) print(w io.Writer) {
	fmt.Fprintf(w, "machine: %s, %d cores, %s, %s\n", m.cpu, m.cores, m.goVer, m.osArch)
	fmt.Fprintf(w, "load average at the start: %s; %s\n", m.load, pressure())
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// loadAverage is the 1, 5 and 15 minute load of the machine.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// pressure is how much of the last minute tasks spent waiting for a CPU or
// for IO (Linux PSI), which says whether other work shared the machine.
func pressure() string {
	var parts []string
	for _, res := range []string{"cpu", "io"} {
		b, err := os.ReadFile("/proc/pressure/" + res)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) {
			if v, ok := strings.CutPrefix(f, "avg60="); ok {
				parts = append(parts, res+" pressure (some, avg60) "+v+"%")
			}
		}
	}
	if len(parts) == 0 {
		return "pressure unknown"
	}
	return strings.Join(parts, ", ")
}
