package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// guessEnv binds TOK (value) to secret.test on the TLS upstream's port.
func guessEnv(t *testing.T, value string) (*env, string) {
	t.Helper()
	e := newEnv(t)
	ph := NewPlaceholder()
	e.rebindGuess(t, ph, value)
	return e, ph
}

// rebindGuess starts the sandbox's proxy state afresh (RemoveSandbox
// forgets revocations) with TOK bound under ph.
func (e *env) rebindGuess(t *testing.T, ph, value string) {
	t.Helper()
	e.p.RemoveSandbox(testSandbox)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}}); err != nil {
		t.Fatal(err)
	}
}

// post sends body to the secret host's reflecting endpoint with the
// placeholder as credential, hdr as extra headers, in pieces of step
// bytes when step > 0 (a chunked body whose writes cut the value).
func (e *env) post(t *testing.T, c *http.Client, ph, path, body string, step int, hdr ...string) (int, string) {
	t.Helper()
	var r io.Reader = strings.NewReader(body)
	if step > 0 {
		pr, pw := io.Pipe()
		go func() {
			for s := body; s != ""; s = s[min(len(s), step):] {
				if _, err := io.WriteString(pw, s[:min(len(s), step)]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		r = pr
	}
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://%s%s", e.secretHost(), path), r)
	req.Header.Set("Authorization", "Bearer "+ph)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestGuessingIsNotAnOracle: a word list POSTed to an endpoint of the
// secret's host that reflects it came back with the right word replaced
// by the placeholder (one request tested a whole list). Now a request of
// the sandbox's own that holds the value, anywhere and in any form the
// scrubber knows, is refused before the host answers, and the secret is
// revoked: after that, right and wrong guesses get the same answer, and
// no answer ever shows which word was the value.
func TestGuessingIsNotAnOracle(t *testing.T) {
	const value = "hunter2-Pass"
	e, ph := guessEnv(t, value)
	c := e.client(true)
	wrong := "password\nletmein\nhunter2-Pasz\nqwerty\n"
	right := "password\nletmein\n" + value + "\nqwerty\n"

	// A wrong list comes back as sent.
	if code, body := e.post(t, c, ph, "/echo?echo=1", wrong, 0); code != 200 || body != wrong {
		t.Fatalf("wrong list: %d %q", code, body)
	}
	// A WebSocket to the host, open before the guess (it echoes frames).
	ws, wsr := e.openWS(t, ph)
	// The right one is refused, never reflected with the placeholder.
	code, body := e.post(t, c, ph, "/echo?echo=1", right, 0)
	if code != 403 || strings.Contains(body, ph) || strings.Contains(body, "letmein") || !strings.Contains(body, "secret TOK") {
		t.Fatalf("right list: %d %q", code, body)
	}
	if r, ok := e.waitFor(t, func(r Record) bool { return r.Reason == ReasonSecretValue }); !ok || r.Secret != "TOK" || r.Decision != DecisionDeny {
		t.Errorf("no secret_value record: %+v", e.ring.Records(testSandbox, 0))
	}
	// The open WebSocket was closed: it cannot echo a further guess.
	ws.Write(maskedFrame(true, 1, []byte("guess wrong-one"), [4]byte{1, 2, 3, 4}))
	if rest, _ := io.ReadAll(wsr); len(rest) != 0 {
		t.Errorf("a WebSocket open before the guess still echoes: %q", rest)
	}
	// From now on every request to the secret's host gets one answer,
	// whatever it holds: nothing more can be learnt.
	c2 := e.client(false)
	var answers []string
	for _, b := range []string{wrong, right, "nothing"} {
		code, body := e.post(t, c2, ph, "/echo?echo=1", b, 0)
		answers = append(answers, fmt.Sprintf("%d %s", code, body))
	}
	code, body, _ = e.get(t, c2, fmt.Sprintf("https://%s/user", e.secretHost()), "Authorization", ph)
	answers = append(answers, fmt.Sprintf("%d %s", code, body))
	for _, a := range answers {
		if a != answers[0] || !strings.HasPrefix(a, "403 ") || !strings.Contains(a, "revoked") {
			t.Fatalf("after the guess, answers differ or are not the revocation: %q", answers)
		}
	}
	if strings.Contains(e.up.all(), "nothing") {
		t.Error("a request after the revocation reached the host")
	}

	// Every place and form a guess can take, each from a fresh start.
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	cases := []struct {
		name       string
		path, body string
		step       int
		hdr        []string
	}{
		{"body in pieces", "/echo?echo=1", strings.Repeat("x", 70000) + value + "tail", 5, nil},
		{"body url-escaped", "/echo?echo=1", "a=" + strings.ReplaceAll(value, "-", "%2D") + "&b", 0, nil},
		{"body base64 at an offset", "/echo?echo=1", "{\"v\":\"" + b64("ab:"+value+"!") + "\"}", 3, nil},
		{"body JSON-escaped", "/echo?echo=1", `{"q": "\u0068\u0075nter2-Pass"}`, 4, nil},
		{"body HTML entities", "/echo?echo=1", "<p>&#104;&#x75;nter2-Pass</p>", 0, nil},
		{"query", "/echo?echo=1&q=" + value, "", 0, nil},
		{"query escaped", "/echo?echo=1&q=%68unter2%2DPass", "", 0, nil},
		{"path", "/echo/" + value + "?echo=1", "", 0, nil},
		{"header", "/echo?echo=1", "", 0, []string{"X-Guess", "try " + value}},
		{"header name", "/echo?echo=1", "", 0, []string{"X-" + value, "1"}},
		{"basic credential", "/echo?echo=1", "", 0, []string{"X-Auth", "Basic " + b64("someone:"+value)}},
	}
	for _, tc := range cases {
		e.rebindGuess(t, ph, value)
		c := e.client(false)
		if code, body := e.post(t, c, ph, tc.path, tc.body, tc.step, tc.hdr...); code != 403 || !strings.Contains(body, "secret TOK") {
			t.Errorf("%s: %d %q, want the guess refused", tc.name, code, body)
		}
		if code, body := e.post(t, c, ph, "/echo?echo=1", "ok", 0); code != 403 || !strings.Contains(body, "revoked") {
			t.Errorf("%s: then %d %q, want revoked", tc.name, code, body)
		}
	}
	// Ordinary traffic with the placeholder is no guess.
	e.rebindGuess(t, ph, value)
	if code, body := e.post(t, e.client(false), ph, "/echo?echo=1", "Bearer "+ph+" "+strings.Repeat("hunter", 1000), 7); code != 200 || !strings.Contains(body, ph) {
		t.Errorf("an ordinary request: %d %.80q", code, body)
	}
}

// TestGuessOverWebSocket: a WebSocket to the secret's host that sends the
// client's messages back would scrub a correct guess to the placeholder;
// a client message holding the value ends the connection instead and
// revokes the secret, while other messages pass as sent.
func TestGuessOverWebSocket(t *testing.T) {
	const value = "ws-guess-VALUE-5"
	e, ph := guessEnv(t, value)
	key := [4]byte{1, 2, 3, 4}
	tc, br := e.openWS(t, ph)
	tc.Write(maskedFrame(true, 1, []byte("guess wrong-value"), key))
	if fs := readWSFramesN(t, br, 1); len(fs) != 1 || string(fs[0].payload) != "guess wrong-value" {
		t.Fatalf("a wrong guess: %v", fs)
	}
	// The value split over two frames of one message.
	tc.Write(maskedFrame(false, 1, []byte("guess "+value[:6]), key))
	tc.Write(maskedFrame(true, 0, []byte(value[6:]), key))
	rest, _ := io.ReadAll(br)
	if bytes.Contains(rest, []byte(ph)) || bytes.Contains(rest, []byte("VALUE")) {
		t.Errorf("the right guess came back: %q", rest)
	}
	if r, ok := e.waitFor(t, func(r Record) bool { return r.Reason == ReasonSecretValue }); !ok || r.Secret != "TOK" {
		t.Errorf("no secret_value record: %+v", e.ring.Records(testSandbox, 0))
	}
	if code, body, _ := e.get(t, e.client(false), fmt.Sprintf("https://%s/user", e.secretHost()), "Authorization", ph); code != 403 || !strings.Contains(body, "revoked") {
		t.Errorf("after the guess: %d %q", code, body)
	}
}

// openWS opens a WebSocket to the secret host's frame echo.
func (e *env) openWS(t *testing.T, ph string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, st := e.rawConnect(t, e.secretHost())
	if c == nil {
		t.Fatalf("CONNECT: %s", st)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "secret.test", RootCAs: e.pool})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(tc, "GET /ws?wsecho=1 HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n", e.secretHost(), ph)
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return tc, br
}

// readWSFramesN reads n frames.
func readWSFramesN(t *testing.T, r *bufio.Reader, n int) []wsFrame {
	t.Helper()
	var out []wsFrame
	for range n {
		var h [2]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return out
		}
		l := int(h[1] & 0x7f)
		if l == 126 {
			var x [2]byte
			io.ReadFull(r, x[:])
			l = int(x[0])<<8 | int(x[1])
		}
		p := make([]byte, l)
		io.ReadFull(r, p)
		out = append(out, wsFrame{fin: h[0]&0x80 != 0, op: h[0] & 0x0f, payload: p})
	}
	return out
}
