package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer echoes what each connection sends, and reports each chunk it
// received on got.
func echoServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					ch <- string(buf[:n])
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends s and reads its echo, with a generous deadline as a
// failure guard.
func roundTrip(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	readEcho(t, c, s, 10*time.Second)
}

func readEcho(t *testing.T, c net.Conn, want string, guard time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(guard))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading the echo of %q: %v", want, err)
	}
	if string(buf) != want {
		t.Fatalf("echo %q, want %q", buf, want)
	}
}

// assertSilent checks that nothing comes back on c for a short while.
func assertSilent(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 1)
	n, err := c.Read(buf)
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silenced connection answered: %q, %v", buf[:n], err)
	}
}

func TestSilenceHoldsConnectionsOpenAndQuietUntilRestore(t *testing.T) {
	t.Parallel()
	target, received := echoServer(t)
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	before := dial(t, p)
	roundTrip(t, before, "a")
	<-received

	p.Silence()
	if _, err := before.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	during := dial(t, p) // accepted while silenced
	if _, err := during.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	assertSilent(t, before)
	assertSilent(t, during)
	select {
	case s := <-received:
		t.Fatalf("the target received %q while the proxy was silenced", s)
	default:
	}

	p.Restore()
	readEcho(t, before, "b", 10*time.Second) // what was held is forwarded
	readEcho(t, during, "c", 10*time.Second)
	roundTrip(t, before, "d")
}

func TestCloseWhileSilencedReturns(t *testing.T) {
	t.Parallel()
	target, _ := echoServer(t)
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	roundTrip(t, c, "a")
	p.Silence()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung on a silenced connection")
	}
}

func TestCutRefusesUntilRestore(t *testing.T) {
	t.Parallel()
	target, _ := echoServer(t)
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	roundTrip(t, c, "a")
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a cut connection stayed open")
	}
	p.Restore()
	roundTrip(t, dial(t, p), "b")
}
