package agent

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// connectTimeout bounds the dial of a loopback port.
const connectTimeout = 5 * time.Second

// handleConnect turns its stream into a TCP connection to a port on the
// sandbox's loopback (IPv4, else IPv6): how the host reaches a server the
// sandbox's code runs (preview URLs). The agent's own listener (the egress
// endpoint) is refused: the host must not reach the sandbox's way out.
func (a *Agent) handleConnect(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, errdefs.InvalidArgument("port: a number from 1 to 65535"))
		return
	}
	if a.ownPort(port) {
		writeError(w, errdefs.Newf(errdefs.ErrPermissionDenied, "port %d is the sandbox agent's own", port))
		return
	}
	c, err := dialLoopback(port)
	if err != nil {
		writeError(w, err)
		return
	}
	defer c.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, errdefs.Newf(errdefs.ErrInternal, "hijack: %v", err))
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Time{}) // the server's timeouts were for the request
	if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
		return
	}
	relay(conn, brw.Reader, c)
}

// ownPort reports whether port is one the agent listens on.
func (a *Agent) ownPort(port int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.egressLn == nil {
		return false
	}
	addr, ok := a.egressLn.Addr().(*net.TCPAddr)
	return ok && addr.Port == port
}

// dialLoopback connects to port on 127.0.0.1, else on ::1.
func dialLoopback(port int) (net.Conn, error) {
	var first error
	for _, host := range []string{"127.0.0.1", "::1"} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), connectTimeout)
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	if errors.Is(first, syscall.ECONNREFUSED) {
		return nil, errdefs.Unavailable("nothing listens on port %d in the sandbox", port)
	}
	return nil, errdefs.Unavailable("connect to port %d in the sandbox: %v", port, first)
}

// relay copies between the host's stream (written to conn, read from in,
// which holds what was buffered) and the sandbox's connection c until both
// directions end. The end of the host's side closes c whole: a yamux
// stream cannot tell a half-close from a close, and a keep-alive server in
// the sandbox would otherwise hold a connection nobody reads for good.
func relay(conn net.Conn, in io.Reader, c net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(c, in)
		c.Close()
	})
	io.Copy(conn, c)
	conn.Close() // a yamux stream's Close sends its end of stream
	wg.Wait()
}
