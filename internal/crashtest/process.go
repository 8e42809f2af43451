package crashtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// proc is a running child process and the lines it prints on stdout.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *strings.Builder // read only once the process was waited for
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
	p := &proc{cmd: cmd, lines: make(chan string, 16), stderr: &strings.Builder{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go scanLines(out, p.lines)
	return p, nil
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

func scanLines(r io.Reader, lines chan<- string) {
	defer close(lines)
	s := bufio.NewScanner(r)
	for s.Scan() {
		lines <- s.Text()
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}
