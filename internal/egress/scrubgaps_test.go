package egress

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// boundFor is a secret bound to host (its value v, no injection format).
func boundFor(t *testing.T, v, ph string, inj Injection, host string) *boundSecret {
	t.Helper()
	hs, err := hostPatterns([]string{host})
	if err != nil {
		t.Fatal(err)
	}
	return &boundSecret{placeholder: ph, hosts: hs, secret: Secret{Name: "S", Value: []byte(v), Hosts: []string{host}, Inject: inj}}
}

// TestScrubBase64AnyOffset: the value inside base64 text at any offset
// (the sandbox picks the text around it: a basic-auth user), in either
// alphabet, padded or not, followed by more text or not, leaves no bit of
// itself in the scrubbed text: scrubbing the text made with one value and
// with another of the same length gives the same output. The scrubber
// skipped the first and last groups and values under 8 characters: a
// 7-character password came back whole, 3-4 bytes of a 12-character one.
func TestScrubBase64AnyOffset(t *testing.T) {
	ph := NewPlaceholder()
	encs := map[string]*base64.Encoding{"std": base64.StdEncoding, "raw": base64.RawStdEncoding, "url": base64.URLEncoding}
	for n := 2; n <= 13; n++ {
		a := strings.Repeat("Q7x!mZ-k/2+pW", 2)[:n] // two values differing in every byte
		b := strings.Repeat("r4Tz_0?Ne8=jH", 2)[:n]
		scA := newScrubber([]*boundSecret{boundFor(t, a, ph, Injection{BasicAuth: &BasicAuth{}}, "h.test")}, "h.test")
		scB := newScrubber([]*boundSecret{boundFor(t, b, ph, Injection{BasicAuth: &BasicAuth{}}, "h.test")}, "h.test")
		for pre := 0; pre <= 5; pre++ {
			for suf := 0; suf <= 4; suf++ {
				for name, enc := range encs {
					mk := func(v string) []byte {
						cred := strings.Repeat("u", pre) + v + strings.Repeat("#", suf)
						return []byte(`{"authorization": "Basic ` + enc.EncodeToString([]byte(cred)) + `", "n": 1}`)
					}
					outA, outB := scA.replace(mk(a)), scB.replace(mk(b))
					if !bytes.Equal(outA, outB) {
						t.Fatalf("len %d, %d bytes before, %d after, %s: the scrubbed text depends on the value:\n%s\n%s", n, pre, suf, name, outA, outB)
					}
					_, in, _ := strings.Cut(string(outA), "Basic ")
					in, _, _ = strings.Cut(in, `"`)
					dec, err := enc.DecodeString(in)
					if err != nil || !strings.Contains(string(dec), ph) {
						t.Errorf("len %d, %d before, %d after, %s: scrubbed %q decodes to %q %v, want the placeholder", n, pre, suf, name, in, dec, err)
					}
				}
			}
		}
	}
	// A stream cut anywhere: the groups around a match are held back.
	v := "pw-1234"
	sc := newScrubber([]*boundSecret{boundFor(t, v, ph, Injection{BasicAuth: &BasicAuth{}}, "h.test")}, "h.test")
	in := strings.Repeat("x "+base64.StdEncoding.EncodeToString([]byte("ab:"+v))+" y ", 40)
	want := sc.replace([]byte(in))
	for step := 1; step < 40; step++ {
		got, err := io.ReadAll(&scrubReader{sc: sc, r: &stepReader{s: in, n: step}, c: io.NopCloser(nil)})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("reads of %d: %v\n got %q\nwant %q", step, err, got, want)
		}
	}
}

// TestBasicAuthEchoAnyUser: through the proxy, a host that echoes the
// Authorization header gives back only user:placeholder, whatever user the
// sandbox chose to shift the value's position.
func TestBasicAuthEchoAnyUser(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	const value = "pw7-Abc" // a 7-byte password stored before the minimum
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "PW", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{BasicAuth: &BasicAuth{}}}}); err != nil {
		t.Fatal(err)
	}
	c := e.client(true)
	for _, user := range []string{"", "a", "ab", "abc", "abcd", "abcde"} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/echo", e.secretHost()), nil)
		req.SetBasicAuth(user, ph)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_, cred, _ := strings.Cut(resp.Header.Get("X-Echo-Auth"), "Basic ")
		dec, err := base64.StdEncoding.DecodeString(cred)
		// The placeholder keeps the value's length mod 3 ('_' pads it), so
		// the base64 after it stays aligned.
		if err != nil || strings.TrimRight(string(dec), "_") != user+":"+ph {
			t.Errorf("user %q: echo %q decodes to %q %v, want %q", user, cred, dec, err, user+":"+ph)
		}
		if strings.Contains(string(body), value) {
			t.Errorf("user %q: body %q", user, body)
		}
	}
	if !strings.Contains(e.up.all(), "auth=Basic "+basicB64("abc", value)) {
		t.Errorf("the upstream did not get the value:\n%s", e.up.all())
	}
}

// tlsThrough opens TLS to target inside a CONNECT tunnel, writes req and
// returns everything the proxy sends back until it closes.
func (e *env) tlsThrough(t *testing.T, target, req string) string {
	t.Helper()
	c, st := e.rawConnect(t, target)
	if c == nil {
		t.Fatalf("CONNECT %s: %s", target, st)
	}
	host, _, _ := strings.Cut(target, ":")
	tc := tls.Client(c, &tls.Config{RootCAs: e.pool, ServerName: host})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(tc, req); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(tc)
	return string(out)
}

// TestStatusLineScrubbed: the reason phrase of every response of a
// secret's host (a 103, the 200 after it, a HEAD's) reaches the sandbox
// as the standard text, never the host's (it carried the value whole).
func TestStatusLineScrubbed(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	const value = "reason-VALUE-77"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"GET", "HEAD"} {
		out := e.tlsThrough(t, e.secretHost(), fmt.Sprintf("%s /s?status=1 HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", m, e.secretHost(), ph))
		if strings.Contains(out, "VALUE") || !strings.Contains(out, "HTTP/1.1 103 Early Hints\r\n") ||
			!strings.Contains(out, "HTTP/1.1 200 OK\r\n") || !strings.Contains(out, "Link: <"+ph+">") {
			t.Errorf("%s: %q", m, out)
		}
	}
}

// TestContentEncodingFailsClosed: a secret's host that names its coding
// in two lines ("identity", then "gzip"), in layers, or in a coding the
// proxy does not read, is refused (502, audited); one gzip layer is read
// and scrubbed.
func TestContentEncodingFailsClosed(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	const value = "gzipped-VALUE-42"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}}); err != nil {
		t.Fatal(err)
	}
	c := e.client(true)
	for _, tc := range []struct {
		ce   string
		code int
	}{{"identity|gzip", 502}, {"gzip|identity", 502}, {"gzip, gzip", 502}, {"identity, gzip", 502}, {"gzip|br", 502}, {"br", 502}, {"gzip", 200}, {"x-gzip", 200}} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/ce?ce2=%s", e.secretHost(), strings.ReplaceAll(tc.ce, " ", "%20")), nil)
		req.Header.Set("Authorization", ph)
		resp, err := c.Transport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := raw
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
			body, _ = io.ReadAll(zr) // what a client that decodes would see
		}
		if resp.StatusCode != tc.code || bytes.Contains(body, []byte("VALUE")) || bytes.Contains(raw, []byte("VALUE")) {
			t.Errorf("Content-Encoding %q: %d (want %d) %q", tc.ce, resp.StatusCode, tc.code, body)
		}
		if tc.code == 502 && resp.Header.Get("X-Space-Egress") != ReasonEncoded {
			t.Errorf("Content-Encoding %q: refused with %q", tc.ce, resp.Header.Get("X-Space-Egress"))
		}
		if tc.code == 200 && string(body) != "auth="+ph {
			t.Errorf("Content-Encoding %q: body %q, want the scrubbed echo", tc.ce, body)
		}
	}
}

// TestRangeCannotRebuildValue: ranges of a body that reflects the value
// (6 bytes at a time rebuilt it, each piece too short to be recognised)
// are not asked for: the host sends the whole body, scrubbed; a 206 it
// sends anyway is refused.
func TestRangeCannotRebuildValue(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	const value = "ranged-VALUE-0123456789"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}}); err != nil {
		t.Fatal(err)
	}
	c := e.client(true)
	var pieces strings.Builder
	for off := 0; off < 30; off += 6 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/r?ranged=1", e.secretHost()), nil)
		req.Header.Set("Authorization", ph)
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off+5, off+10))
		req.Header.Set("If-Range", `"x"`)
		code, body := doBody(t, c, req)
		if code != 200 || body != "auth="+ph+" end" {
			t.Errorf("Range at %d: %d %q, want the whole scrubbed body", off, code, body)
		}
		pieces.WriteString(body)
	}
	if strings.Contains(pieces.String(), "VALUE") || strings.Contains(e.up.all(), "Range") {
		t.Errorf("pieces %q; upstream saw %s", pieces.String(), e.up.all())
	}
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s/p?partial=1", e.secretHost()), nil)
	req.Header.Set("Authorization", ph)
	if code, body := doBody(t, c, req); code != 502 || strings.Contains(body, "ranged") {
		t.Errorf("an unasked 206: %d %q", code, body)
	}
}

func doBody(t *testing.T, c *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSecretBoundToPort: a secret bound to host:port is injected only
// there; the same host on another port the policy allows gets a refusal
// (placeholder_leak) and never the value. A binding without a port means
// 443 only (bindings made before ports were named keep working on the
// standard port).
func TestSecretBoundToPort(t *testing.T) {
	e := newEnv(t)
	up2 := httptest.NewUnstartedServer(e.up.handler())
	up2.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return e.upCA.leaf(h.ServerName, time.Now()) }}
	up2.StartTLS()
	t.Cleanup(up2.Close)
	port2 := up2.Listener.Addr().(interface{ String() string }).String()
	_, p2, _ := strings.Cut(port2, "127.0.0.1:")
	e.allow(t, fmt.Sprintf("secret.test:%d,secret.test:%s", e.tlsPort, p2), "")
	const value = "port-bound-VALUE-1"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}}); err != nil {
		t.Fatal(err)
	}
	c := e.client(false)
	if code, body, err := e.get(t, c, fmt.Sprintf("https://%s/ok", e.secretHost()), "Authorization", ph); err != nil || code != 200 || !strings.Contains(body, "auth="+ph) {
		t.Fatalf("the bound port: %d %q %v", code, body, err)
	}
	if code, body, _ := e.get(t, c, "https://secret.test:"+p2+"/other", "Authorization", ph); code != 403 || !strings.Contains(body, "placeholder") {
		t.Errorf("another port: %d %q", code, body)
	}
	if n := strings.Count(e.up.all(), "auth="+value); n != 1 {
		t.Errorf("the value reached the upstream %d times, want once:\n%s", n, e.up.all())
	}
	if _, ok := e.waitFor(t, func(r Record) bool { return r.Reason == ReasonLeak && r.Port != e.tlsPort && r.Secret == "TOK" }); !ok {
		t.Errorf("no placeholder_leak record for the other port: %+v", e.ring.Records(testSandbox, 0))
	}
	// Without a port: 443 only.
	b := boundFor(t, value, ph, Injection{Header: "X"}, "api.example.com")
	if !b.matchHost("api.example.com", 443) || b.matchHost("api.example.com", 8443) || !b.matchName("api.example.com") {
		t.Error("a binding without a port is not 443 only")
	}
	b = boundFor(t, value, ph, Injection{Header: "X"}, "*.example.com:8443")
	if b.matchHost("a.example.com", 443) || !b.matchHost("a.example.com", 8443) {
		t.Error("*.example.com:8443")
	}
}
