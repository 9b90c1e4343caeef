package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Transport yields the byte streams the agent serves yamux sessions on.
// Dialing transports (the agent calls the host) hand out a new connection
// only after the previous one was closed, so exactly one session is live;
// listening transports hand out every accepted connection. New kinds
// (virtio-serial, vsock) implement this interface.
type Transport interface {
	// Next blocks until the next connection is ready. io.EOF means the
	// transport is exhausted.
	Next(ctx context.Context) (io.ReadWriteCloser, error)
}

const (
	backoffMin = 2 * time.Millisecond
	backoffMax = 100 * time.Millisecond
)

// Dial returns a Transport that dials network/addr, redialing with a short
// backoff (2 ms doubling to 100 ms, forever) whenever the previous
// connection broke.
func Dial(network, addr string) Transport {
	return &dialer{dial: func(ctx context.Context) (io.ReadWriteCloser, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// DialFunc is Dial with a custom dial function (vsock, a serial device…).
func DialFunc(dial func(ctx context.Context) (io.ReadWriteCloser, error)) Transport {
	return &dialer{dial: dial}
}

type dialer struct {
	dial func(ctx context.Context) (io.ReadWriteCloser, error)
	prev chan struct{} // closed when the current connection is closed
}

func (d *dialer) Next(ctx context.Context) (io.ReadWriteCloser, error) {
	if d.prev != nil {
		select {
		case <-d.prev:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	wait := backoffMin
	for {
		c, err := d.dial(ctx)
		if err == nil {
			done := make(chan struct{})
			d.prev = done
			return &notifyConn{ReadWriteCloser: c, done: done}, nil
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(wait*2, backoffMax)
	}
}

// notifyConn closes done when closed.
type notifyConn struct {
	io.ReadWriteCloser
	once sync.Once
	done chan struct{}
}

func (c *notifyConn) Close() error {
	err := c.ReadWriteCloser.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// Listen returns a Transport that serves every connection accepted on ln.
func Listen(ln net.Listener) Transport { return &listener{ln: ln} }

type listener struct{ ln net.Listener }

func (l *listener) Next(ctx context.Context) (io.ReadWriteCloser, error) {
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	c, err := l.ln.Accept()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return c, err
}

// Stdio returns a Transport serving one session over stdin/stdout.
func Stdio() Transport { return &stdio{} }

type stdio struct{ used bool }

func (s *stdio) Next(ctx context.Context) (io.ReadWriteCloser, error) {
	if s.used {
		return nil, io.EOF
	}
	s.used = true
	return stdioConn{}, nil
}

type stdioConn struct{}

func (stdioConn) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdioConn) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdioConn) Close() error                { return errors.Join(os.Stdin.Close(), os.Stdout.Close()) }

// parseAddr splits "unix:/path" (or a bare path) into network and address.
func parseAddr(s string) (network, addr string, err error) {
	network, addr, ok := strings.Cut(s, ":")
	if !ok {
		if strings.HasPrefix(s, "/") {
			return "unix", s, nil
		}
		return "", "", errors.New("address must look like unix:/path")
	}
	switch network {
	case "unix", "tcp":
		return network, addr, nil
	}
	return "", "", errors.New("unsupported network " + network)
}
