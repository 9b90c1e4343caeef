package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Vsock returns a listening Transport on AF_VSOCK port port (any local
// CID): every connection the host opens to that port is a session. With
// Firecracker the host connects to the vsock device's unix socket and sends
// "CONNECT <port>"; the host side is internal/driver/firecracker.
//
// The socket is created on the first Next and retried with a backoff while
// the kernel has no vsock transport yet (its modules load during VM init).
// Connections survive nothing: Firecracker resets every vsock connection at
// a snapshot; the listening socket stays and the host connects again.
func Vsock(port uint32) Transport { return &vsockListener{port: port} }

// ParseVsockPort parses a --vsock value: a port number, optionally written
// "vsock:PORT".
func ParseVsockPort(s string) (uint32, error) {
	p, err := strconv.ParseUint(strings.TrimPrefix(s, "vsock:"), 10, 32)
	if err != nil || p == unix.VMADDR_PORT_ANY {
		return 0, fmt.Errorf("vsock port must look like 1024 or vsock:1024, got %q", s)
	}
	return uint32(p), nil
}

type vsockListener struct {
	port uint32
	ln   *os.File // the listening socket, non-blocking, in the runtime poller
}

// listen creates, binds and listens on the socket.
func (v *vsockListener) listen() error {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: v.port}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("vsock bind port %d: %w", v.port, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return fmt.Errorf("vsock listen: %w", err)
	}
	v.ln = os.NewFile(uintptr(fd), fmt.Sprintf("vsock:%d", v.port))
	return nil
}

// missingTransport reports errors of a kernel without (loaded) vsock.
func missingTransport(err error) bool {
	return errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EADDRNOTAVAIL)
}

func (v *vsockListener) Next(ctx context.Context) (io.ReadWriteCloser, error) {
	wait := backoffMin
	for v.ln == nil {
		err := v.listen()
		if err == nil {
			break
		}
		if !missingTransport(err) {
			return nil, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(wait*2, backoffMax)
	}
	// Accept in the runtime poller; ctx ends the wait through a deadline.
	_ = v.ln.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = v.ln.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := v.ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	for {
		var nfd int
		var aerr error
		err := rc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			return !errors.Is(aerr, unix.EAGAIN)
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("vsock accept: %w", err)
		}
		switch {
		case aerr == nil:
			return os.NewFile(uintptr(nfd), "vsock-conn"), nil
		case errors.Is(aerr, unix.ECONNABORTED), errors.Is(aerr, unix.EINTR):
			continue // the peer gave up before the accept
		default:
			return nil, fmt.Errorf("vsock accept: %w", aerr)
		}
	}
}
