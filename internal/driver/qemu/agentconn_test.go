package qemu

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestHandshake plays the guest: stale bytes of an old session first, then
// the answer to the host's ping; after the start line both sides see only
// session bytes.
func TestHandshake(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	go func() {
		// More than the handshake's buffer without a newline: skipped in
		// pieces (ReadString grew one line in the server without bound).
		guest.Write([]byte("\x00\x01stale yamux bytes without newline" + strings.Repeat("x", 200<<10)))
		br := bufio.NewReader(guest)
		var nonce string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if i := strings.Index(line, serialPing); i >= 0 {
				nonce = strings.TrimSpace(line[i+len(serialPing):])
				guest.Write([]byte("\n" + serialHello + nonce + "\n"))
				break
			}
		}
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.TrimSpace(line) == serialStart+nonce {
				break
			}
			if !strings.Contains(line, serialPing) && strings.TrimSpace(line) != "" {
				t.Errorf("unexpected line before start: %q", line)
			}
		}
		guest.Write([]byte("session-data"))
		b := make([]byte, 4)
		io.ReadFull(br, b)
		guest.Write(b)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := handshake(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len("session-data"))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "session-data" {
		t.Fatalf("read %q, %v", b, err)
	}
	c.Write([]byte("ping"))
	if _, err := io.ReadFull(c, b[:4]); err != nil || string(b[:4]) != "ping" {
		t.Fatalf("echo %q, %v", b[:4], err)
	}
}

func TestHandshakeCancel(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	go io.Copy(io.Discard, guest) // a guest that never answers
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	if _, err := handshake(ctx, host); err == nil {
		t.Fatal("handshake without an answer succeeded")
	}
}
