package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseVsockPort(t *testing.T) {
	for in, want := range map[string]uint32{"1024": 1024, "vsock:52": 52} {
		if got, err := ParseVsockPort(in); err != nil || got != want {
			t.Errorf("ParseVsockPort(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "unix:/a", "-1", "4294967295", "4294967296"} {
		if _, err := ParseVsockPort(in); err == nil {
			t.Errorf("ParseVsockPort(%q) accepted", in)
		}
	}
}

// requireVsock skips unless this kernel has AF_VSOCK.
func requireVsock(t *testing.T) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Skipf("no AF_VSOCK in this kernel: %v", err)
	}
	unix.Close(fd)
}

// TestVsockNextCancel: a Next waiting for a host ends with its context,
// and the transport stays usable for the next call.
func TestVsockNextCancel(t *testing.T) {
	requireVsock(t)
	v := Vsock(unix.VMADDR_PORT_ANY).(*vsockListener) // any free port
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		start := time.Now()
		_, err := v.Next(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next: %v, want deadline exceeded", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Next returned after %s", d)
		}
	}
	sa, err := unix.Getsockname(int(v.ln.Fd()))
	if vm, ok := sa.(*unix.SockaddrVM); err != nil || !ok || vm.Port == unix.VMADDR_PORT_ANY {
		t.Errorf("listening on %+v, %v", sa, err)
	}
	v.ln.Close()
}

// TestVsockLoopback connects through the vsock loopback transport, where
// the kernel has it, and checks the session stream both ways.
func TestVsockLoopback(t *testing.T) {
	requireVsock(t)
	if _, err := os.Stat("/sys/module/vsock_loopback"); err != nil {
		t.Skip("vsock_loopback is not loaded: no local vsock connections on this host")
	}
	v := Vsock(unix.VMADDR_PORT_ANY).(*vsockListener)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan io.ReadWriteCloser, 1)
	go func() {
		c, err := v.Next(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	for v.ln == nil {
		time.Sleep(time.Millisecond)
	}
	sa, _ := unix.Getsockname(int(v.ln.Fd()))
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	host := os.NewFile(uintptr(fd), "host")
	defer host.Close()
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: sa.(*unix.SockaddrVM).Port}); err != nil {
		t.Fatal(err)
	}
	guest := <-got
	if guest == nil {
		t.FailNow()
	}
	defer guest.Close()
	host.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(guest, b); err != nil || string(b) != "ping" {
		t.Fatalf("read %q, %v", b, err)
	}
}
