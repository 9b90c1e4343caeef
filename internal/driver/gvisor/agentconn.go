package gvisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// The host side of the agent's connections: the socket the agent dials
// out to (listen, offer: one authenticated session at a time, auth.go),
// the connections handed to the client (DialAgent) and their tracking, so
// that a checkpoint can drop them and the agent be told to reconnect.

// listen opens the host side of the agent socket and accepts connections
// into i.conns once they authenticated (auth.go). One session at a time:
// a new connection never displaces the one handed out, it waits for the
// client's next dial (the newest waits: an older waiting one is closed,
// the agent only ever holds one).
func (i *Instance) listen() error {
	_ = os.Remove(i.sockPath())
	ln, err := net.Listen("unix", i.sockPath())
	if err != nil {
		return fmt.Errorf("gvisor: agent socket: %w", err)
	}
	i.mu.Lock()
	i.ln = ln
	i.mu.Unlock()
	go func() {
		handshakes := make(chan struct{}, maxHandshakes)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case handshakes <- struct{}{}:
			default:
				c.Close() // a flood of connections: not the agent
				continue
			}
			go func() {
				ok := i.admit(c)
				<-handshakes
				if !ok {
					c.Close()
					return
				}
				i.offer(i.track(c))
			}()
		}
	}()
	return nil
}

// offer queues an authenticated connection for DialAgent.
func (i *Instance) offer(c net.Conn) {
	for {
		select {
		case i.conns <- c:
			return
		default:
			select {
			case old := <-i.conns:
				old.Close()
			default:
			}
		}
	}
}

// DialAgent implements driver.Instance: it returns the agent's next
// connection to the host socket.
func (i *Instance) DialAgent(ctx context.Context) (net.Conn, error) {
	for {
		select {
		case c := <-i.conns:
			i.mu.Lock()
			_, ok := i.live[c]
			i.mu.Unlock()
			if !ok {
				continue // dropped at a checkpoint while queued
			}
			return c, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("gvisor: waiting for agent of %s: %w", i.id, errdefs.ErrUnavailable)
		case <-i.gone:
			return nil, fmt.Errorf("gvisor: sandbox %s was destroyed: %w", i.id, errdefs.ErrUnavailable)
		}
	}
}

// trackedConn removes itself from the instance's live set when closed.
type trackedConn struct {
	net.Conn
	i    *Instance
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.i.mu.Lock()
		delete(c.i.live, c)
		c.i.mu.Unlock()
	})
	return c.Conn.Close()
}

func (i *Instance) track(c net.Conn) net.Conn {
	t := &trackedConn{Conn: c, i: i}
	i.mu.Lock()
	if i.live == nil {
		i.live = map[net.Conn]struct{}{}
	}
	i.live[t] = struct{}{}
	i.mu.Unlock()
	return t
}

// liveConns returns the agent connections open now.
func (i *Instance) liveConns() []net.Conn {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]net.Conn, 0, len(i.live))
	for c := range i.live {
		out = append(out, c)
	}
	return out
}

// reconnectAgent follows a checkpoint or restore. gVisor drops host
// sockets when it saves a sandbox, without closing the host's end and
// without telling the guest until the guest next writes. So the host
// closes every connection that existed before (its client redials and
// waits for the agent's next connection instead of writing into a dead
// one), and SIGUSR1 tells the agent to probe its session now: a dead one
// fails the probe's write at once and the agent redials; a live one is
// left alone. The signal is sent in the background: callers that need
// the agent wait for its connection anyway. The agent's own keepalive
// (30 s) is the backstop should the signal be lost.
func (i *Instance) reconnectAgent(stale []net.Conn) {
	closeAll(stale)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := i.d.runsc(ctx, i, nil, "kill", i.id, "USR1"); err != nil {
			i.log.Debug("agent reconnect signal", "err", err)
		}
	}()
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}
