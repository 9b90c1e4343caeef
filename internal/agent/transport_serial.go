package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Session delimiting on a serial port (virtio-serial, QEMU's virtserialport).
//
// A serial port has no connection boundary the guest can rely on: the host
// side may disconnect and reconnect faster than the guest notices, and bytes
// of a dead session may still sit in either direction's buffers. So every
// session starts with a short line handshake, and everything before it is
// discarded:
//
//	host  → guest   "\nSPACE-HOST-PING <nonce>\n"   repeated (~50 ms) until answered
//	guest → host    "\nSPACE-AGENT-HELLO <nonce>\n" once per nonce
//	host  → guest   "\nSPACE-HOST-START <nonce>\n"  then yamux (host is the client)
//
// The nonce is fresh per host connection, so neither side can mistake a
// stale line for the current session. A ping reaching a still-running old
// guest session is not valid yamux ('S' is not yamux version 0), which ends
// that session at once; the agent then handshakes again on the same port.
// While no host is connected a read of the port returns EOF: the agent
// retries with a short backoff. The host side is internal/driver/qemu.
const (
	serialPing  = "SPACE-HOST-PING "
	serialHello = "SPACE-AGENT-HELLO "
	serialStart = "SPACE-HOST-START "
)

// Serial returns a Transport over the serial port device at path. A path
// /dev/virtio-ports/<name> (the udev convention) is resolved through
// /sys/class/virtio-ports when no udev made the link: the kernel's own
// node name (vport<device>p<port>) depends on device probe order. It
// yields one session at a time: the next one after the previous connection
// was closed and a host handshook anew.
func Serial(path string) Transport {
	return &serialTransport{open: func() (io.ReadWriteCloser, error) {
		return os.OpenFile(resolvePort(path), os.O_RDWR, 0)
	}}
}

// resolvePort maps /dev/virtio-ports/<name> to /dev/vportXpY by the port
// names in sysfs, unless the path exists.
func resolvePort(path string) string {
	if _, err := os.Stat(path); err == nil {
		return path
	}
	dir, name := filepath.Split(path)
	if filepath.Clean(dir) != "/dev/virtio-ports" {
		return path
	}
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, n := range names {
		if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(n))
		}
	}
	return path
}

type serialTransport struct {
	open func() (io.ReadWriteCloser, error)
	prev chan struct{}
}

func (s *serialTransport) Next(ctx context.Context) (io.ReadWriteCloser, error) {
	if s.prev != nil {
		select {
		case <-s.prev:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	wait := backoffMin
	for {
		f, err := s.open()
		if err == nil {
			var c io.ReadWriteCloser
			c, err = serialHandshake(ctx, f)
			if err == nil {
				done := make(chan struct{})
				s.prev = done
				return &notifyConn{ReadWriteCloser: c, done: done}, nil
			}
			f.Close()
		}
		// The device is not there yet (modules loading) or broke.
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(wait*2, backoffMax)
	}
}

// serialHandshake waits on the open port f for a host's ping, answers it
// and returns once the host's start line for that nonce arrived. Reads that
// return EOF (no host connected) are retried with a backoff.
func serialHandshake(ctx context.Context, f io.ReadWriteCloser) (io.ReadWriteCloser, error) {
	br := bufio.NewReaderSize(f, 64<<10)
	answered := ""
	wait := backoffMin
	for {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		line, err := br.ReadString('\n')
		if err == nil {
			wait = backoffMin
			line = strings.TrimSpace(line)
			if i := strings.Index(line, serialPing); i >= 0 {
				if nonce := line[i+len(serialPing):]; nonce != "" && nonce != answered {
					if _, err := io.WriteString(f, "\n"+serialHello+nonce+"\n"); err != nil {
						return nil, err
					}
					answered = nonce
				}
			} else if answered != "" && strings.HasSuffix(line, serialStart+answered) {
				return &bufferedRWC{r: br, ReadWriteCloser: f}, nil
			}
			continue
		}
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		// No host on the other end: wait for one.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// bufferedRWC reads through r (which may hold bytes already read past the
// handshake) and writes and closes the underlying stream.
type bufferedRWC struct {
	r *bufio.Reader
	io.ReadWriteCloser
	once sync.Once
}

func (b *bufferedRWC) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufferedRWC) Close() error {
	var err error
	b.once.Do(func() { err = b.ReadWriteCloser.Close() })
	return err
}
