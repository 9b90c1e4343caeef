package sandbox

import (
	"context"
	"net"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
)

// maxPortConns bounds the connections open to one sandbox's ports at once
// (a browser opens about six per page; each costs an agent stream, two
// goroutines and buffers on both sides).
const maxPortConns = 256

// DialPort opens a TCP connection to port on a running sandbox's loopback,
// through its agent: how previews reach a server the sandbox runs. The
// sandbox has no network of its own, so nothing else can.
func (s *Service) DialPort(ctx context.Context, c Caller, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.InvalidArgument("port: a number from 1 to 65535")
	}
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if l.conns.Add(1) > maxPortConns {
		l.conns.Add(-1)
		return nil, errdefs.Unavailable("%d connections to this sandbox's ports are open, the most at once; close one first", maxPortConns)
	}
	conn, err := l.agent.Connect(ctx, port)
	if err != nil {
		l.conns.Add(-1)
		return nil, err
	}
	return &portConn{Conn: conn, done: func() { l.conns.Add(-1) }}, nil
}

// portConn gives its place back once, when closed.
type portConn struct {
	net.Conn
	once sync.Once
	done func()
}

func (c *portConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.done)
	return err
}

type callerKey struct{}

// WithCaller returns ctx carrying c, for DialPortFrom.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// DialPortFrom is DialPort as the caller ctx carries (WithCaller): the
// shape of a dialer a proxy's transport calls with the request's context.
func (s *Service) DialPortFrom(ctx context.Context, id string, port int) (net.Conn, error) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "a port connection needs a caller")
	}
	return s.DialPort(ctx, c, id, port)
}
