package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkProxyConnect measures per-request latency through the proxy
// against a direct loopback connection: a new connection per request
// ("cold": dial, CONNECT, TLS handshake) and on a kept-alive connection
// ("warm"), for plain HTTP, TLS passthrough and TLS interception.
func BenchmarkProxyConnect(b *testing.B) {
	e := newEnv(b)
	e.allow(b, fmt.Sprintf("allowed.test:%d,allowed.test:%d,secret.test:%d", e.httpPort, e.tlsPort, e.tlsPort), "")
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "T", Value: []byte("bench-value"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}}); err != nil {
		b.Fatal(err)
	}
	direct := func(keep bool) *http.Client {
		return &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: e.pool, ServerName: "allowed.test"},
			DisableKeepAlives: !keep,
		}, Timeout: 10 * time.Second}
	}
	cases := []struct {
		name  string
		url   string
		proxy bool
	}{
		{"http/direct", fmt.Sprintf("http://127.0.0.1:%d/", e.httpPort), false},
		{"http/proxy", fmt.Sprintf("http://allowed.test:%d/", e.httpPort), true},
		{"tls/direct", fmt.Sprintf("https://127.0.0.1:%d/", e.tlsPort), false},
		{"tls/proxy-passthrough", fmt.Sprintf("https://allowed.test:%d/", e.tlsPort), true},
		{"tls/proxy-intercept", fmt.Sprintf("https://secret.test:%d/", e.tlsPort), true},
	}
	for _, keep := range []bool{false, true} {
		mode := "cold"
		if keep {
			mode = "warm"
		}
		for _, c := range cases {
			b.Run(mode+"/"+c.name, func(b *testing.B) {
				cl := direct(keep)
				if c.proxy {
					cl = e.client(keep)
				}
				defer cl.CloseIdleConnections()
				for b.Loop() {
					req, _ := http.NewRequest("GET", c.url, nil)
					if strings.Contains(c.name, "intercept") {
						req.Header.Set("Authorization", ph)
					}
					resp, err := cl.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatal(resp.Status)
					}
				}
			})
		}
	}
}

// BenchmarkProxyThroughput downloads 100 MB through the proxy (TLS
// passthrough and interception) and directly.
func BenchmarkProxyThroughput(b *testing.B) {
	e := newEnv(b)
	e.allow(b, fmt.Sprintf("allowed.test:%d,secret.test:%d", e.tlsPort, e.tlsPort), "")
	ph := NewPlaceholder()
	// A token-sized value: responses from its host are scrubbed of it.
	e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "T", Value: []byte("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "X-T"}}})
	const size = 100 << 20
	for _, c := range []struct{ name, url string }{
		{"direct", fmt.Sprintf("https://127.0.0.1:%d/?size=%d", e.tlsPort, size)},
		{"proxy-passthrough", fmt.Sprintf("https://allowed.test:%d/?size=%d", e.tlsPort, size)},
		{"proxy-intercept", fmt.Sprintf("https://secret.test:%d/?size=%d", e.tlsPort, size)},
	} {
		b.Run(c.name, func(b *testing.B) {
			cl := e.client(true)
			if c.name == "direct" {
				cl = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.pool, ServerName: "allowed.test"}}}
			}
			defer cl.CloseIdleConnections()
			b.SetBytes(size)
			for b.Loop() {
				resp, err := cl.Get(c.url)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != size {
					b.Fatalf("got %d bytes", n)
				}
			}
		})
	}
}

// BenchmarkWSScrub is the WebSocket scrubber's throughput on 64 KiB
// binary frames that hold no secret (the common case).
func BenchmarkWSScrub(b *testing.B) {
	ph := NewPlaceholder()
	hosts, _ := hostPatterns([]string{"h.test"})
	sc := newScrubber([]*boundSecret{{placeholder: ph, secret: Secret{Name: "T", Value: []byte("QSECRET_bench_value")}, hosts: hosts}}, "h.test")
	payload := make([]byte, 64<<10)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	frame := appendWSFrame(nil, true, 2, payload)
	var in []byte
	for range 64 {
		in = append(in, frame...)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r := newWSScrubReader(sc, bufio.NewReaderSize(bytes.NewReader(in), 64<<10))
		if _, err := io.Copy(io.Discard, r); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBody is 4 MiB of text with base64 runs and no secret: what a
// scrubbed response body or a guarded request body usually is.
func benchBody() []byte {
	var buf bytes.Buffer
	for i := 0; buf.Len() < 4<<20; i++ {
		fmt.Fprintf(&buf, `{"id": %d, "name": "item-%d \"q\"", "blob": "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo%04d=="}`+"\n", i, i, i%10000)
	}
	return buf.Bytes()
}

// BenchmarkScrubBody is the response scrubber's throughput for a
// token-sized secret (raw, escaped, formatted and base64 forms).
func BenchmarkScrubBody(b *testing.B) {
	hosts, _ := hostPatterns([]string{"h.test"})
	sc := newScrubber([]*boundSecret{{placeholder: NewPlaceholder(), secret: Secret{Name: "T", Value: []byte("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"), Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}, hosts: hosts}}, "h.test")
	in := benchBody()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r := &scrubReader{sc: sc, r: bytes.NewReader(in), c: io.NopCloser(nil)}
		if _, err := io.Copy(io.Discard, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardBody is the cost of searching a request body to a
// secret's host for the value (guess.go), read 32 KiB at a time.
func BenchmarkGuardBody(b *testing.B) {
	hosts, _ := hostPatterns([]string{"h.test"})
	sc := newScrubber([]*boundSecret{{placeholder: NewPlaceholder(), secret: Secret{Name: "T", Value: []byte("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"), Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}, hosts: hosts}}, "h.test")
	in := benchBody()
	buf := make([]byte, 32<<10)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		g := &guardReader{sc: sc, r: bytes.NewReader(in)}
		if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{g}, buf); err != nil {
			b.Fatal(err)
		}
	}
}
