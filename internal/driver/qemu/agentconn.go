package qemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Host side of the serial-port session handshake (the guest side and the
// reasoning are in internal/agent/transport_serial.go). QEMU's chardev
// socket carries the guest's virtio-serial port; the driver connects to it,
// pings with a fresh nonce until the agent answers with that nonce, sends
// the start line and hands the stream to yamux. Bytes before the answer
// (the tail of an earlier session) are discarded.
const (
	serialPing  = "SPACE-HOST-PING "
	serialHello = "SPACE-AGENT-HELLO "
	serialStart = "SPACE-HOST-START "

	pingInterval = 50 * time.Millisecond
)

// handshake runs the host side of the session handshake on c.
func handshake(ctx context.Context, c net.Conn) (net.Conn, error) {
	b := make([]byte, 8)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	stopRead := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Unix(1, 0)) })
	defer stopRead()

	var wg sync.WaitGroup
	quit := make(chan struct{})
	wg.Go(func() {
		t := time.NewTicker(pingInterval)
		defer t.Stop()
		for {
			if _, err := c.Write([]byte("\n" + serialPing + nonce + "\n")); err != nil {
				return
			}
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	})
	stopPing := func() { close(quit); wg.Wait() }

	br := bufio.NewReaderSize(c, 64<<10)
	want := serialHello + nonce
	for {
		// ReadSlice, not ReadString: a guest streaming bytes without a
		// newline grew the line in the server without bound. A line
		// longer than the buffer is not the hello: skipped.
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			stopPing()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("agent handshake: %w", err)
		}
		if strings.HasSuffix(strings.TrimSpace(string(line)), want) {
			break
		}
	}
	// No ping may follow the start line: the agent reads yamux after it.
	stopPing()
	if !stopRead() {
		return nil, ctx.Err() // cancelled just now: the deadline is set
	}
	if _, err := c.Write([]byte("\n" + serialStart + nonce + "\n")); err != nil {
		return nil, fmt.Errorf("agent handshake: %w", err)
	}
	return &bufConn{Conn: c, r: br}, nil
}

// bufConn reads through r, which may hold bytes read past the handshake.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
