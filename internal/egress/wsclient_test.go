package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestWSClientReader: a client's frames pass byte for byte; what is not a
// client frame (an HTTP request, an unmasked frame, reserved bits or
// opcodes, a long or fragmented control frame) ends the stream.
func TestWSClientReader(t *testing.T) {
	key := [4]byte{9, 8, 7, 6}
	good := bytes.Join([][]byte{
		maskedFrame(false, 1, []byte("hello "), key),
		maskedFrame(true, 0, bytes.Repeat([]byte("w"), 70000), key),
		maskedFrame(true, 9, []byte("ping"), key),
		maskedFrame(true, 2, nil, key),
		maskedFrame(true, 8, []byte{3, 232}, key),
	}, nil)
	for _, ext := range []bool{false, true} {
		got, err := io.ReadAll(newWSClientReader(bufio.NewReader(bytes.NewReader(good)), ext, nil))
		if err != nil || !bytes.Equal(got, good) {
			t.Fatalf("ext=%v: valid frames: %v, %d of %d bytes", ext, err, len(got), len(good))
		}
	}
	rsv1 := maskedFrame(true, 1, []byte("x"), key)
	rsv1[0] |= 0x40
	if _, err := io.ReadAll(newWSClientReader(bufio.NewReader(bytes.NewReader(rsv1)), true, nil)); err != nil {
		t.Errorf("RSV1 with an extension agreed: %v", err)
	}
	bad := map[string][]byte{
		"an HTTP request": []byte("GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"),
		"lower case":      []byte("get / HTTP/1.1\r\n\r\n"),
		"unmasked":        appendWSFrame(nil, true, 1, []byte("hi")),
		"RSV1, no ext":    rsv1,
		"opcode 3":        maskedFrame(true, 3, []byte("x"), key),
		"opcode 11":       maskedFrame(true, 11, nil, key),
		"long ping":       maskedFrame(true, 9, make([]byte, 126), key),
		"fragmented ping": maskedFrame(false, 9, nil, key),
	}
	for name, b := range bad {
		for _, ext := range []bool{false, true} {
			if name == "RSV1, no ext" && ext {
				continue
			}
			in := append(append([]byte{}, maskedFrame(true, 1, []byte("ok"), key)...), b...)
			got, err := io.ReadAll(newWSClientReader(bufio.NewReader(bytes.NewReader(in)), ext, nil))
			if !errors.Is(err, errWSClientFrame) || len(got) > len(in)-len(b) {
				t.Errorf("%s (ext=%v): %v after %d bytes", name, ext, err, len(got))
			}
		}
	}
}

// TestUpgradePinned: after a 101 the connection stays on the upstream it
// was upgraded on and carries WebSocket frames only. A second HTTP request
// sent on it (for another host, to an upstream that would read HTTP
// again) never reaches the upstream: the raw pipe used to pass it, so
// Host pinning ended at the 101. Frames still pass both ways.
func TestUpgradePinned(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d,secret.test:%d", e.httpPort, e.tlsPort), "")
	const wsReq = "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	smuggled := "GET /second HTTP/1.1\r\nHost: other.test\r\n\r\n"
	key := [4]byte{1, 2, 3, 4}
	frame := maskedFrame(true, 1, []byte("a frame"), key)
	type path struct {
		name string
		open func(t *testing.T, query string) (io.ReadWriter, *bufio.Reader)
	}
	paths := []path{
		{"absolute-URI HTTP", func(t *testing.T, q string) (io.ReadWriter, *bufio.Reader) {
			c, err := net.Dial("tcp", e.proxyAddr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			h := fmt.Sprintf("allowed.test:%d", e.httpPort)
			fmt.Fprintf(c, wsReq, "http://"+h+"/ws"+q, h)
			return c, bufio.NewReader(c)
		}},
		{"HTTP in CONNECT", func(t *testing.T, q string) (io.ReadWriter, *bufio.Reader) {
			h := fmt.Sprintf("allowed.test:%d", e.httpPort)
			c, st := e.rawConnect(t, h)
			if c == nil {
				t.Fatalf("CONNECT: %s", st)
			}
			fmt.Fprintf(c, wsReq, "/ws"+q, h)
			return c, bufio.NewReader(c)
		}},
		{"intercepted TLS", func(t *testing.T, q string) (io.ReadWriter, *bufio.Reader) {
			c, st := e.rawConnect(t, e.secretHost())
			if c == nil {
				t.Fatalf("CONNECT: %s", st)
			}
			tc := tls.Client(c, &tls.Config{ServerName: "secret.test", RootCAs: e.pool})
			fmt.Fprintf(tc, wsReq, "/ws"+q, e.secretHost())
			return tc, bufio.NewReader(tc)
		}},
	}
	for i, p := range paths {
		if p.name == "intercepted TLS" {
			if err := e.p.BindSecrets(testSandbox, map[string]Secret{NewPlaceholder(): {Name: "TOK", Value: []byte("pinned-VALUE-1"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "X-T"}}}); err != nil {
				t.Fatal(err)
			}
		}
		// A second request after the 101.
		rw, br := p.open(t, fmt.Sprintf("?reparse=%d", i))
		if c, ok := rw.(net.Conn); ok {
			c.SetDeadline(time.Now().Add(10 * time.Second))
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("%s: upgrade: %v %v", p.name, resp, err)
		}
		io.WriteString(rw, smuggled)
		rest, _ := io.ReadAll(br)
		if strings.Contains(string(rest), "200 OK") {
			t.Errorf("%s: the smuggled request was answered: %q", p.name, rest)
		}
		// Frames pass, and come back (the upstream echoes them).
		rw, br = p.open(t, "?wsecho=1")
		if c, ok := rw.(net.Conn); ok {
			c.SetDeadline(time.Now().Add(10 * time.Second))
		}
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("%s: upgrade: %v %v", p.name, resp, err)
		}
		rw.Write(frame)
		back := make([]byte, 9)
		if _, err := io.ReadFull(br, back); err != nil || !strings.HasSuffix(string(back), "a frame") && !bytes.Equal(back, frame[:9]) {
			t.Errorf("%s: the frame did not come back: %q %v", p.name, back, err)
		}
	}
	// The upstream records a request before it answers it: none was.
	if seen := e.up.all(); strings.Contains(seen, "after-101") {
		t.Errorf("a request after the 101 reached the upstream:\n%s", seen)
	}
}
