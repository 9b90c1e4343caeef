package firecracker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Host side of Firecracker's vsock (docs/vsock.md, "Host-Initiated
// Connections"): Firecracker listens on the device's unix socket
// (uds_path); the host connects, sends "CONNECT <port>\n" and reads
// "OK <host port>\n" once a guest socket listening on that vsock port
// accepted. From then on the connection is the byte stream to the guest
// socket. When nothing listens on the port in the guest (still booting),
// Firecracker closes the connection instead of answering.

// AgentPort is the guest vsock port space-agent listens on (--vsock).
const AgentPort = 1024

// guestCID is the guest's vsock context id. Each Firecracker process has
// its own vsock device behind its own unix socket, so every VM can use the
// lowest guest CID.
const guestCID = 3

// errNoListener means Firecracker closed the connection without an answer:
// no guest socket listens on the port (yet).
var errNoListener = errors.New("vsock: no guest listener on the port")

// vsockConnect runs the CONNECT handshake for port on c, a fresh connection
// to the vsock unix socket, and returns the stream to the guest. ctx bounds
// the handshake. Bytes the guest sent right after the answer are kept.
func vsockConnect(ctx context.Context, c net.Conn, port uint32) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		stop()
		return nil, vsockErr(ctx, err)
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if !stop() {
		return nil, ctx.Err() // cancelled just now: the deadline is set
	}
	if err != nil {
		if line == "" && !isTimeout(err) {
			return nil, errNoListener
		}
		return nil, vsockErr(ctx, err)
	}
	hostPort, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "OK ")
	if _, perr := strconv.ParseUint(hostPort, 10, 32); !ok || perr != nil {
		return nil, fmt.Errorf("vsock: unexpected answer %q to CONNECT %d", strings.TrimSpace(line), port)
	}
	return &bufConn{Conn: c, r: br}, nil
}

func vsockErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("vsock handshake: %w", err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// bufConn reads through r, which may hold bytes read past the handshake.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
