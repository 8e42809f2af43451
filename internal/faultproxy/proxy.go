// Package faultproxy is a TCP proxy that tests put between a service and a
// database or broker, to cut, silence and restore the connection for real.
package faultproxy

import (
	"net"
	"sync"
)

// Proxy forwards TCP connections from its own address to a target.
type Proxy struct {
	target string
	ln     net.Listener
	closed chan struct{}

	mu    sync.Mutex
	cut   bool
	quiet chan struct{} // non-nil while silenced; closed by Restore
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, closed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() string {
	_, port, _ := net.SplitHostPort(p.Addr())
	return port
}

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Silence keeps every connection open, and accepts new ones, but forwards
// nothing in either direction until Restore: a peer that accepts the
// connection and never answers. What is sent meanwhile is held, and
// forwarded in order after Restore.
func (p *Proxy) Silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.quiet == nil {
		p.quiet = make(chan struct{})
	}
}

// Restore accepts and forwards connections again, after Cut or Silence.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.quiet != nil {
		close(p.quiet)
		p.quiet = nil
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	close(p.closed)
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = client.Close()
			continue
		}
		p.mu.Unlock()
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// track registers a connection pair, unless the proxy was cut meanwhile.
func (p *Proxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		_ = a.Close()
		_ = b.Close()
		return false
	}
	p.conns[a] = struct{}{}
	p.conns[b] = struct{}{}
	return true
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.awaitVoice() {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// awaitVoice waits while the proxy is silenced; false when it closes
// meanwhile.
func (p *Proxy) awaitVoice() bool {
	p.mu.Lock()
	quiet := p.quiet
	p.mu.Unlock()
	if quiet == nil {
		return true
	}
	select {
	case <-quiet:
		return true
	case <-p.closed:
		return false
	}
}
