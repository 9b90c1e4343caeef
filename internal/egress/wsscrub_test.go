package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// wsFrame is one parsed frame.
type wsFrame struct {
	fin     bool
	op      byte
	payload []byte
}

// readWSFrames parses unmasked frames until EOF or a close, failing on RSV bits or a
// masked frame.
func readWSFrames(t *testing.T, r io.Reader) []wsFrame {
	t.Helper()
	br := bufio.NewReader(r)
	var out []wsFrame
	for {
		var h [10]byte
		if _, err := io.ReadFull(br, h[:2]); err != nil {
			return out
		}
		if h[0]&0x70 != 0 || h[1]&0x80 != 0 {
			t.Fatalf("frame with RSV bits or a mask: %x", h[:2])
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			io.ReadFull(br, h[2:4])
			n = uint64(binary.BigEndian.Uint16(h[2:4]))
		case 127:
			io.ReadFull(br, h[2:10])
			n = binary.BigEndian.Uint64(h[2:10])
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(br, p); err != nil {
			t.Fatalf("short frame: %v", err)
		}
		out = append(out, wsFrame{h[0]&0x80 != 0, h[0] & 0x0f, p})
		if h[0]&0x0f == 8 {
			return out // close
		}
	}
}

// maskedFrame is a frame with its payload masked by key.
func maskedFrame(fin bool, op byte, payload []byte, key [4]byte) []byte {
	f := appendWSFrame(nil, fin, op, nil)
	f = f[:1]
	n := len(payload)
	switch {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n <= 0xffff:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	f = append(f, key[:]...)
	for i, b := range payload {
		f = append(f, b^key[i%4])
	}
	return f
}

// The host's frames come out scrubbed: a value split across a message's
// fragments (a ping between them), in a masked frame, across the 64 KiB
// pieces of a large frame, in a close frame's reason; the messages are
// otherwise what was sent. A frame using an extension's bits ends it.
func TestWSScrubReader(t *testing.T) {
	const value = "QSECRET_A_456-reflected"
	ph := NewPlaceholder()
	sc := newScrubber([]*boundSecret{{placeholder: ph, secret: Secret{Name: "T", Value: []byte(value)}, hosts: mustHosts(t, "h.test")}}, "h.test")
	big := strings.Repeat("x", wsChunk-10) + value + strings.Repeat("y", 3*wsChunk)
	var in []byte
	in = appendWSFrame(in, false, 1, []byte("one "+value[:4]))
	in = appendWSFrame(in, true, 9, []byte("ping"))
	in = appendWSFrame(in, false, 0, []byte(value[4:11]))
	in = appendWSFrame(in, true, 0, []byte(value[11:]+" end"))
	in = append(in, maskedFrame(true, 2, []byte("two "+value), [4]byte{1, 2, 3, 4})...)
	in = appendWSFrame(in, true, 1, []byte(big))
	in = appendWSFrame(in, true, 8, append([]byte{3, 232}, "bye "+value...))
	frames := readWSFrames(t, newWSScrubReader(sc, bufio.NewReader(bytes.NewReader(in))))
	var msgs []string
	var cur []byte
	var ctl []string
	for _, f := range frames {
		if bytes.Contains(f.payload, []byte("QSECRET")) {
			t.Errorf("frame op %d carries the secret", f.op)
		}
		if f.op >= 8 {
			ctl = append(ctl, fmt.Sprintf("%d:%s", f.op, f.payload))
			continue
		}
		cur = append(cur, f.payload...)
		if f.fin {
			msgs = append(msgs, string(cur))
			cur = nil
		}
	}
	want := []string{"one " + ph + " end", "two " + ph, strings.Replace(big, value, ph, 1)}
	if len(msgs) != len(want) {
		t.Fatalf("%d messages, want %d", len(msgs), len(want))
	}
	for i := range want {
		if msgs[i] != want[i] {
			t.Errorf("message %d: %.80q…, want %.80q…", i, msgs[i], want[i])
		}
	}
	if len(ctl) != 2 || ctl[0] != "9:ping" || ctl[1] != "8:\x03\xe8bye "+ph {
		t.Errorf("control frames %q", ctl)
	}
	rsv := appendWSFrame(nil, true, 1, []byte("compressed"))
	rsv[0] |= 0x40
	_, err := io.ReadAll(newWSScrubReader(sc, bufio.NewReader(bytes.NewReader(rsv))))
	if !errors.Is(err, errWSFrame) {
		t.Errorf("a frame with RSV1: %v, want refused", err)
	}
}

func mustHosts(t *testing.T, h ...string) []*rule {
	t.Helper()
	r, err := hostPatterns(h)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Through the proxy: a secret's host that echoes the credential in a
// WebSocket message (and a close reason) gives the sandbox the
// placeholder; the compression extension the client offered is not
// passed on; a switch to another protocol is refused.
func TestWebSocketToSecretHostScrubbed(t *testing.T) {
	e := newEnv(t)
	target := fmt.Sprintf("secret.test:%d", e.tlsPort)
	e.allow(t, target, "")
	const value = "QSECRET_WS_789"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}}); err != nil {
		t.Fatal(err)
	}
	upgrade := func(proto string, path ...string) (string, []wsFrame) {
		c, st := e.rawConnect(t, target)
		if c == nil {
			t.Fatalf("CONNECT: %s", st)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "secret.test", RootCAs: e.pool})
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(tc, "GET /ws%s HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\nAuthorization: Bearer %s\r\n\r\n", strings.Join(path, ""), target, proto, ph)
		br := bufio.NewReader(tc)
		var head strings.Builder
		for {
			l, err := br.ReadString('\n')
			head.WriteString(l)
			if err != nil || l == "\r\n" {
				break
			}
		}
		if !strings.Contains(head.String(), " 101 ") {
			return head.String(), nil
		}
		return head.String(), readWSFrames(t, br)
	}
	head, frames := upgrade("websocket")
	if len(frames) != 2 {
		t.Fatalf("%s: %d frames", head, len(frames))
	}
	for _, f := range frames {
		if bytes.Contains(f.payload, []byte(value)) {
			t.Errorf("frame op %d carries the secret: %q", f.op, f.payload)
		}
	}
	if got := string(frames[0].payload); got != "auth=Bearer "+ph+" ext=" {
		t.Errorf("message %q, want the placeholder and no extension", got)
	}
	// h2c is not asked for (its streams could name other hosts): the
	// host answers as HTTP/1.1; a 101 to it anyway is refused.
	if head, frames := upgrade("h2c"); frames != nil || !strings.Contains(head, " 200 ") || strings.Contains(head, value) {
		t.Errorf("an h2c upgrade request: %q", head)
	}
	if head, frames := upgrade("websocket", "?force101=h2c"); frames != nil || !strings.Contains(head, " 502 ") || strings.Contains(head, value) {
		t.Errorf("switch to another protocol: %q", head)
	}
}

// A frame claiming a huge length is passed on piece by piece as it
// arrives (the scrubber held the whole frame, so a host could exhaust the
// server's memory with one header); a length with its top bit set is
// refused.
func TestWSScrubReaderBounded(t *testing.T) {
	ph := NewPlaceholder()
	sc := newScrubber([]*boundSecret{{placeholder: ph, secret: Secret{Name: "T", Value: []byte("QSECRET_big")}, hosts: mustHosts(t, "h.test")}}, "h.test")
	head := []byte{0x82, 127}
	head = binary.BigEndian.AppendUint64(head, 1<<40) // a terabyte
	// 64 MiB of it arrive (a regression fails on their end, not by
	// exhausting the test machine's memory).
	src := io.MultiReader(bytes.NewReader(head), io.LimitReader(endless{}, 64<<20))
	r := newWSScrubReader(sc, bufio.NewReader(src))
	got, err := io.ReadFull(r, make([]byte, 4<<20))
	if err != nil || got != 4<<20 {
		t.Fatalf("first 4 MiB of a terabyte frame: %d, %v", got, err)
	}
	if len(r.buf) > 2*wsChunk || cap(r.out) > 4*wsChunk {
		t.Errorf("the scrubber holds %d + %d bytes", cap(r.buf), cap(r.out))
	}
	bad := []byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}
	if _, err := io.ReadAll(newWSScrubReader(sc, bufio.NewReader(bytes.NewReader(bad)))); !errors.Is(err, errWSFrame) {
		t.Errorf("a length with its top bit set: %v", err)
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

// A header name holding a value, in any case, is scrubbed, also when the
// placeholder itself contains the value (it looped for good).
func TestReplaceFold(t *testing.T) {
	sc := newScrubber([]*boundSecret{{placeholder: "space_ph_abc", secret: Secret{Name: "T", Value: []byte("space")}, hosts: mustHosts(t, "h.test")}}, "h.test")
	done := make(chan string, 1)
	go func() { done <- sc.replaceFold("X-Space-Space") }()
	select {
	case got := <-done:
		if got != "X-space_ph_abc-space_ph_abc" {
			t.Errorf("replaceFold = %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("replaceFold did not end")
	}
}
