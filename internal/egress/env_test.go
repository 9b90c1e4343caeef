package egress

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const testSandbox = "sb-test"

// lockedBuffer is a goroutine-safe log sink.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// countingResolver answers from a table and counts lookups per name.
type countingResolver struct {
	mu    sync.Mutex
	calls map[string]int
	fn    func(host string, call int) []net.IP
}

func (r *countingResolver) LookupIP(_ context.Context, host string) ([]net.IP, error) {
	r.mu.Lock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[host]++
	n := r.calls[host]
	r.mu.Unlock()
	if r.fn != nil {
		if ips := r.fn(host, n); ips != nil {
			return ips, nil
		}
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *countingResolver) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// upstream records what test servers received.
type upstream struct {
	mu   sync.Mutex
	seen []string // "host auth query"
}

func (u *upstream) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		line := fmt.Sprintf("host=%s auth=%s query=%s body=%d", r.Host, r.Header.Get("Authorization"), r.URL.RawQuery, len(body))
		u.mu.Lock()
		u.seen = append(u.seen, line+" headers="+fmt.Sprint(r.Header))
		u.mu.Unlock()
		q := r.URL.Query()
		up := r.Header.Get("Upgrade")
		if f := q.Get("force101"); f != "" {
			up = f // a 101 to a protocol the client may not have asked for
		}
		if up != "" {
			// A WebSocket (or another protocol) that sends back what it
			// was given: the credential, and the extensions it was offered.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", up)
			if q.Get("reparse") != "" {
				// An upstream that goes on reading HTTP after its 101:
				// what reaches it is recorded as a request.
				brw.Flush()
				for {
					req, err := http.ReadRequest(brw.Reader)
					if err != nil {
						return
					}
					u.mu.Lock()
					u.seen = append(u.seen, "after-101 host="+req.Host+" path="+req.URL.Path)
					u.mu.Unlock()
					fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					brw.Flush()
				}
			}
			if q.Get("wsecho") != "" { // sends the client's frames back as they are (masked)
				brw.Flush()
				io.Copy(c, brw)
				return
			}
			msg := []byte("auth=" + r.Header.Get("Authorization") + " ext=" + r.Header.Get("Sec-WebSocket-Extensions"))
			brw.Write(appendWSFrame(nil, true, 1, msg))
			brw.Write(appendWSFrame(nil, true, 8, append([]byte{3, 232}, msg[:min(len(msg), 100)]...)))
			brw.Flush()
			io.Copy(io.Discard, brw) // until the client goes
			return
		}
		auth := r.Header.Get("Authorization")
		switch {
		case q.Get("echo") != "": // the request body, sent back
			w.Write(body)
			return
		case q.Get("status") != "": // the credential in reason phrases (103, then 200; HEAD too)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 103 Hints %s\r\nLink: <%s>\r\n\r\n", auth, auth)
			fmt.Fprintf(brw, "HTTP/1.1 200 Fine %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", auth)
			if r.Method != http.MethodHead {
				brw.WriteString("ok")
			}
			brw.Flush()
			return
		case q.Get("ce2") != "": // Content-Encoding lines as given ("identity|gzip": two lines)
			w.Header()["Content-Encoding"] = strings.Split(q.Get("ce2"), "|")
			zw := gzip.NewWriter(w)
			fmt.Fprint(zw, "auth="+auth)
			zw.Close()
			return
		case q.Get("ranged") != "": // honours Range over a body that reflects the credential
			http.ServeContent(w, r, "echo.txt", time.Time{}, strings.NewReader("auth="+auth+" end"))
			return
		case q.Get("partial") != "": // a 206 nobody asked for
			w.Header().Set("Content-Range", "bytes 0-5/100")
			w.WriteHeader(http.StatusPartialContent)
			fmt.Fprint(w, auth[:min(len(auth), 6)])
			return
		}
		if n, err := strconv.Atoi(q.Get("size")); err == nil {
			w.Header().Set("Content-Length", strconv.Itoa(n))
			_, _ = io.CopyN(w, zeros{}, int64(n))
			return
		}
		// Services that send back what they were given: a redirect
		// keeping the query, an echo in a header, an encoded or repeated
		// echo in the body.
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		if q.Get("name") != "" { // the credential as a header's name
			w.Header().Set("X-Name-"+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), "1")
		}
		if q.Get("redirect") != "" {
			http.Redirect(w, r, "/elsewhere?"+r.URL.RawQuery, http.StatusMovedPermanently)
			return
		}
		if n, err := strconv.Atoi(q.Get("repeat")); err == nil {
			w.Header().Set("Content-Length", strconv.Itoa(n*(len(line)+1)))
			for range n {
				fmt.Fprintln(w, line)
			}
			return
		}
		if q.Get("trailer") != "" {
			w.Header().Set("Trailer", "X-Echo-Trailer")
			fmt.Fprint(w, "body")
			w.(http.Flusher).Flush()
			w.Header().Set("X-Echo-Trailer", r.Header.Get("Authorization"))
			return
		}
		switch q.Get("encoding") {
		case "gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprint(zw, line)
			zw.Close()
			return
		case "br":
			w.Header().Set("Content-Encoding", "br")
			fmt.Fprint(w, "not really brotli: "+line)
			return
		}
		fmt.Fprint(w, line)
	})
}

func (u *upstream) all() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.seen, "\n")
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type env struct {
	t         *testing.T
	p         *Proxy
	ring      *Ring
	logs      *lockedBuffer
	res       *countingResolver
	up        *upstream
	upCA      *CA
	httpPort  int
	tlsPort   int
	proxyAddr string
	pool      *x509.CertPool // trusts the upstream CA and the sandbox CA
}

type envOpt func(*Config)

// newEnv starts a plain and a TLS upstream on 127.0.0.1, reachable as
// allowed.test, secret.test and other.test only through the explicit Hosts
// map and AllowCIDRs 127.0.0.0/8, and a proxy listener for testSandbox.
func newEnv(t testing.TB, opts ...envOpt) *env {
	t.Helper()
	up := &upstream{}
	upCA, err := newCA("upstream-test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(up.handler())
	t.Cleanup(hs.Close)
	ts := httptest.NewUnstartedServer(up.handler())
	ts.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		name := h.ServerName
		if name == "" {
			name = "127.0.0.1"
		}
		return upCA.leaf(name, time.Now())
	}}
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	upPool := x509.NewCertPool()
	upPool.AddCert(upCA.cert)

	logs := &lockedBuffer{}
	ring := NewRing(100)
	res := &countingResolver{}
	lo := []net.IP{net.ParseIP("127.0.0.1")}
	cfg := Config{
		Resolver:     res,
		Hosts:        map[string][]net.IP{"allowed.test": lo, "secret.test": lo, "other.test": lo},
		AllowCIDRs:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Audit:        ring,
		RootCAs:      upPool,
		Logger:       slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SniffTimeout: 200 * time.Millisecond,
	}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{p: p, ring: ring, logs: logs, res: res, up: up, upCA: upCA,
		httpPort: hs.Listener.Addr().(*net.TCPAddr).Port, tlsPort: ts.Listener.Addr().(*net.TCPAddr).Port}
	if tt, ok := t.(*testing.T); ok {
		e.t = tt
	}
	e.proxyAddr = serveProxy(t, p, testSandbox)
	caPEM, err := p.CAFor(testSandbox)
	if err != nil {
		t.Fatal(err)
	}
	e.pool = upPool.Clone()
	if !e.pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("sandbox CA PEM did not parse")
	}
	return e
}

// serveProxy is the test stand-in for the agent tunnel: every accepted
// connection is served for one fixed sandbox.
func serveProxy(t testing.TB, p *Proxy, sandboxID string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.ServeConn(ctx, sandboxID, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-acceptDone
		cancel()
		wg.Wait()
	})
	return ln.Addr().String()
}

// secretHost is the binding of secret.test on the TLS upstream's port.
func (e *env) secretHost() string { return fmt.Sprintf("secret.test:%d", e.tlsPort) }

func (e *env) allow(t testing.TB, allow, deny string) {
	t.Helper()
	pol, err := ParsePolicy(allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.SetPolicy(testSandbox, pol); err != nil {
		t.Fatal(err)
	}
}

func (e *env) client(keepAlive bool) *http.Client {
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: e.proxyAddr}),
		TLSClientConfig:   &tls.Config{RootCAs: e.pool},
		DisableKeepAlives: !keepAlive,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (e *env) get(t testing.TB, c *http.Client, u string, hdr ...string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// rawConnect opens a CONNECT tunnel by hand and returns the conn after a
// 200, or the status line of a refusal.
func (e *env) rawConnect(t testing.TB, target string) (net.Conn, string) {
	t.Helper()
	c, err := net.Dial("tcp", e.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	status, rest := readResponse(t, c)
	c.SetReadDeadline(time.Time{})
	if !strings.Contains(status, " 200 ") {
		return nil, status + "\n" + rest
	}
	return c, status
}

// readResponse reads a response head (and a Content-Length body) byte by
// byte so nothing after it is consumed.
func readResponse(t testing.TB, c net.Conn) (status, body string) {
	t.Helper()
	var head []byte
	b := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if _, err := c.Read(b); err != nil {
			return string(head), ""
		}
		head = append(head, b[0])
	}
	lines := strings.Split(string(head), "\r\n")
	n := 0
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "content-length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	bb := make([]byte, n)
	_, _ = io.ReadFull(c, bb)
	return lines[0], string(bb)
}

// waitRecords waits briefly for n audit records (tunnels are audited
// when they end).
func (e *env) waitRecords(t testing.TB, n int) []Record {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs := e.ring.Records(testSandbox, 0)
		if len(rs) >= n || time.Now().After(deadline) {
			return rs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls the audit ring until a record satisfies ok.
func (e *env) waitFor(t testing.TB, ok func(Record) bool) (Record, bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, r := range e.ring.Records(testSandbox, 0) {
			if ok(r) {
				return r, true
			}
		}
		if time.Now().After(deadline) {
			return Record{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
