package firecracker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeVsockUDS plays Firecracker's end of the vsock unix socket: it reads
// the CONNECT line and hands the connection and the line to answer.
func fakeVsockUDS(t *testing.T, answer func(c net.Conn, br *bufio.Reader, line string)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), vsockName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				answer(c, br, line)
			}()
		}
	}()
	return path
}

func connectTo(t *testing.T, path string, timeout time.Duration) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	c, err := dialUnix(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := vsockConnect(ctx, c, AgentPort)
	if err != nil {
		c.Close()
	}
	return conn, err
}

// TestVsockConnect: the CONNECT line is sent as documented, the OK answer
// consumed, and guest bytes sent right behind the answer are not lost.
func TestVsockConnect(t *testing.T) {
	path := fakeVsockUDS(t, func(c net.Conn, br *bufio.Reader, line string) {
		if line != "CONNECT 1024\n" {
			t.Errorf("request %q", line)
			return
		}
		io.WriteString(c, "OK 1073741824\nhello")
		io.Copy(c, br)
	})
	conn, err := connectTo(t, path, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := make([]byte, 5)
	if _, err := io.ReadFull(conn, b); err != nil || string(b) != "hello" {
		t.Fatalf("first bytes %q, %v", b, err)
	}
	conn.Write([]byte("ping"))
	if _, err := io.ReadFull(conn, b[:4]); err != nil || string(b[:4]) != "ping" {
		t.Fatalf("echo %q, %v", b[:4], err)
	}
}

// TestVsockConnectNoListener: Firecracker closes the connection when no
// guest socket listens on the port (the agent is still booting).
func TestVsockConnectNoListener(t *testing.T) {
	path := fakeVsockUDS(t, func(net.Conn, *bufio.Reader, string) {})
	if _, err := connectTo(t, path, 5*time.Second); !errors.Is(err, errNoListener) {
		t.Fatalf("err = %v, want errNoListener", err)
	}
}

func TestVsockConnectBadAnswer(t *testing.T) {
	for _, answer := range []string{"FAIL\n", "OK\n", "OK x\n", "ok 5\n"} {
		path := fakeVsockUDS(t, func(c net.Conn, _ *bufio.Reader, _ string) { io.WriteString(c, answer) })
		if _, err := connectTo(t, path, 5*time.Second); err == nil || errors.Is(err, errNoListener) || !strings.Contains(err.Error(), "unexpected answer") {
			t.Errorf("answer %q: err = %v", answer, err)
		}
	}
}

// TestVsockConnectCancel: a guest that never answers (a paused VM) does
// not hold the caller past its context.
func TestVsockConnectCancel(t *testing.T) {
	path := fakeVsockUDS(t, func(c net.Conn, br *bufio.Reader, _ string) { io.Copy(io.Discard, br) })
	start := time.Now()
	_, err := connectTo(t, path, 150*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("returned after %s", d)
	}
}
