package agentclient

import (
	"context"
	"net"
	"sync"
)

// AcceptDialer adapts a listener the agent dials into (the host listens on
// a unix socket, the agent connects) to New's dial function. It accepts in
// the background; each dial returns the newest connection not yet handed
// out, waiting for the agent to (re)connect when there is none. Close the
// listener to stop it.
func AcceptDialer(ln net.Listener) func(ctx context.Context) (net.Conn, error) {
	a := &acceptor{ln: ln, ready: make(chan struct{})}
	go a.loop()
	return a.dial
}

type acceptor struct {
	ln net.Listener

	mu      sync.Mutex
	pending net.Conn
	err     error
	ready   chan struct{} // closed and replaced when pending or err changes
}

func (a *acceptor) loop() {
	for {
		c, err := a.ln.Accept()
		a.mu.Lock()
		if err != nil {
			a.err = err
		} else {
			if a.pending != nil {
				a.pending.Close() // superseded: the agent moved on to c
			}
			a.pending = c
		}
		close(a.ready)
		a.ready = make(chan struct{})
		a.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (a *acceptor) dial(ctx context.Context) (net.Conn, error) {
	for {
		a.mu.Lock()
		if c := a.pending; c != nil {
			a.pending = nil
			a.mu.Unlock()
			return c, nil
		}
		if a.err != nil {
			err := a.err
			a.mu.Unlock()
			return nil, err
		}
		ready := a.ready
		a.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
