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
	fmt.Fprintf(w, "load average at the start: %s\n", m.load)
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
