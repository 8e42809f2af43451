package crashtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// proc is a running child process and the lines it prints on stdout.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *strings.Builder // read only once the process was waited for

	mu     sync.Mutex
	counts map[string]int // the child's "COUNT <what>" lines, not passed on
}

// command re-executes the test binary to run test as a child, with env
// added to the parent's environment.
func command(test string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v=false")
	cmd.Env = append(append(os.Environ(), env...), EnvChild+"="+test)
	return cmd
}

// startProc starts cmd and scans its stdout into lines.
func startProc(cmd *exec.Cmd) (*proc, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, lines: make(chan string, 16), stderr: &strings.Builder{}, counts: map[string]int{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go p.scanLines(out)
	return p, nil
}

// countLine is the prefix of a line that counts an event of the child
// ([countEvent]): tallied by the parent, not passed on in lines, so that a
// child that prints many does not hold up its kill point's line.
const countLine = "COUNT "

// tally returns the counts of a process that was killed: its output was
// read to the end, so they are all there.
func (p *proc) tally() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts
}

// kill sends SIGKILL and waits for the process and its output.
func (p *proc) kill() error {
	if err := p.cmd.Process.Kill(); err != nil {
		return err
	}
	_ = p.cmd.Wait()
	for range p.lines { // drain the scanner
	}
	return nil
}

// exited is the error of a process whose output ended before it was
// killed.
func (p *proc) exited() error {
	err := p.cmd.Wait()
	return fmt.Errorf("child exited before it was killed (%v): %s", err, tail(p.stderr.String()))
}

// killedStderr kills the process and returns its stderr, for a child that
// neither halted nor idled in time.
func (p *proc) killedStderr() string {
	_ = p.kill()
	return tail(p.stderr.String())
}

func (p *proc) scanLines(r io.Reader) {
	defer close(p.lines)
	s := bufio.NewScanner(r)
	for s.Scan() {
		if what, ok := strings.CutPrefix(s.Text(), countLine); ok {
			p.mu.Lock()
			p.counts[what]++
			p.mu.Unlock()
			continue
		}
		p.lines <- s.Text()
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}
