package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

func TestConnectTLSEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.tlsPort), "")
	code, body, err := e.get(t, e.client(false), fmt.Sprintf("https://allowed.test:%d/hello", e.tlsPort))
	if err != nil || code != 200 {
		t.Fatalf("GET through CONNECT: %d %q %v", code, body, err)
	}
	if !strings.Contains(body, "host=allowed.test:") {
		t.Errorf("upstream saw %q", body)
	}
	rs := e.waitRecords(t, 1)
	r := rs[len(rs)-1]
	if r.Decision != DecisionAllow || r.Method != "CONNECT" || r.SNI != "allowed.test" || r.IP != "127.0.0.1" || r.BytesUp == 0 || r.BytesDown == 0 {
		t.Errorf("audit record = %+v", r)
	}
	if e.res.total() != 0 {
		t.Errorf("Hosts entries must not reach the resolver")
	}
}

func TestPlainHTTPThroughProxy(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	c := e.client(true)
	for i := range 3 { // keep-alive: three requests, each decided
		code, body, err := e.get(t, c, fmt.Sprintf("http://allowed.test:%d/p?i=%d", e.httpPort, i))
		if err != nil || code != 200 || !strings.Contains(body, fmt.Sprintf("query=i=%d", i)) {
			t.Fatalf("plain GET %d: %d %q %v", i, code, body, err)
		}
	}
	rs := e.waitRecords(t, 3)
	if len(rs) != 3 {
		t.Fatalf("want 3 records, have %d", len(rs))
	}
	for _, r := range rs {
		if r.Method != "GET" || r.Decision != DecisionAllow || r.BytesUp == 0 || r.BytesDown == 0 || r.Port != e.httpPort {
			t.Errorf("record %+v", r)
		}
	}
	if !strings.Contains(e.up.all(), "User-Agent:[Go-http-client/1.1]") {
		t.Errorf("client headers not forwarded intact: %s", e.up.all())
	}
}

func TestDeniedNameNoLookup(t *testing.T) {
	e := newEnv(t)
	e.res.fn = func(string, int) []net.IP { return []net.IP{net.ParseIP("203.0.113.9")} }
	c := e.client(false)
	// No policy at all: default deny.
	code, body, err := e.get(t, c, "http://evil.test/")
	if err != nil || code != 403 || body != "space egress: evil.test:80 refused: egress is disabled (default deny)\n" {
		t.Fatalf("default deny: %d %q %v", code, body, err)
	}
	e.allow(t, "allowed.test", "")
	code, body, _ = e.get(t, c, "http://evil.test/x")
	if code != 403 || !strings.Contains(body, "evil.test:80 refused: not in the allow list") {
		t.Errorf("denied name: %d %q", code, body)
	}
	if _, _, err := e.get(t, c, "https://evil.test/"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("CONNECT to a denied name: %v", err)
	}
	if n := e.res.total(); n != 0 {
		t.Errorf("refused names were resolved %d times", n)
	}
	rs := e.waitRecords(t, 3)
	for _, r := range rs {
		if r.Decision != DecisionDeny || r.Reason != ReasonNotAllowed || r.Host != "evil.test" {
			t.Errorf("record %+v", r)
		}
	}
}

func TestDefaultsStayStrict(t *testing.T) {
	// Without Hosts/AllowCIDRs, a name resolving to 127.0.0.1 is refused.
	e := newEnv(t, func(c *Config) { c.Hosts = nil; c.AllowCIDRs = nil })
	e.res.fn = func(string, int) []net.IP { return []net.IP{net.ParseIP("127.0.0.1")} }
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	code, body, _ := e.get(t, e.client(false), fmt.Sprintf("http://allowed.test:%d/", e.httpPort))
	if code != 403 || !strings.Contains(body, "resolves to a loopback address") {
		t.Errorf("loopback resolution: %d %q", code, body)
	}
	// With the Hosts map but no AllowCIDRs: still refused.
	e2 := newEnv(t, func(c *Config) { c.AllowCIDRs = nil })
	e2.allow(t, fmt.Sprintf("allowed.test:%d", e2.httpPort), "")
	code, _, _ = e2.get(t, e2.client(false), fmt.Sprintf("http://allowed.test:%d/", e2.httpPort))
	if code != 403 {
		t.Errorf("Hosts without AllowCIDRs: %d", code)
	}
	if got := e2.ring.Records(testSandbox, 1); len(got) != 1 || got[0].Reason != ReasonPrivate {
		t.Errorf("records %+v", got)
	}
}

func TestDNSRebinding(t *testing.T) {
	var mu sync.Mutex
	var dialed []string
	var target string
	dialer := dialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, target) // the "public" host is our loopback server
	})
	e := newEnv(t, func(c *Config) { c.Hosts = nil; c.AllowCIDRs = nil; c.Dialer = dialer })
	target = fmt.Sprintf("127.0.0.1:%d", e.httpPort)
	// First answer public, every later one loopback.
	e.res.fn = func(_ string, call int) []net.IP {
		if call == 1 {
			return []net.IP{net.ParseIP("203.0.113.7")}
		}
		return []net.IP{net.ParseIP("127.0.0.1")}
	}
	e.allow(t, fmt.Sprintf("rebind.test:%d", e.httpPort), "")
	c := e.client(false)
	code, _, err := e.get(t, c, fmt.Sprintf("http://rebind.test:%d/", e.httpPort))
	if err != nil || code != 200 {
		t.Fatalf("first request: %d %v", code, err)
	}
	code, body, _ := e.get(t, c, fmt.Sprintf("http://rebind.test:%d/", e.httpPort))
	if code != 403 || !strings.Contains(body, "loopback") {
		t.Errorf("rebound request: %d %q", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) != 1 || dialed[0] != fmt.Sprintf("203.0.113.7:%d", e.httpPort) {
		t.Errorf("dialed %v, want only the vetted address", dialed)
	}
	if e.res.calls["rebind.test"] != 2 {
		t.Errorf("lookups = %d, want one per request", e.res.calls["rebind.test"])
	}
	// Mixed answers: the private one is never dialled.
	e.res.fn = func(string, int) []net.IP {
		return []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("203.0.113.8")}
	}
	dialed = nil
	mu.Unlock()
	code, _, _ = e.get(t, c, fmt.Sprintf("http://rebind.test:%d/", e.httpPort))
	mu.Lock()
	if code != 200 || len(dialed) != 1 || !strings.HasPrefix(dialed[0], "203.0.113.8:") {
		t.Errorf("mixed answers: %d dialed %v", code, dialed)
	}
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialFunc) DialContext(ctx context.Context, n, a string) (net.Conn, error) {
	return f(ctx, n, a)
}

func TestSNIChecks(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.tlsPort), "")
	target := fmt.Sprintf("allowed.test:%d", e.tlsPort)
	for _, tc := range []struct {
		name, sni, reason string
	}{
		{"mismatch", "other.test", ReasonSNIMismatch},
		{"missing", "", ReasonMissingSNI},
		{"placeholder", NewPlaceholder() + ".allowed.test", ReasonLeak},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, status := e.rawConnect(t, target)
			if c == nil {
				t.Fatalf("CONNECT refused: %s", status)
			}
			cfg := &tls.Config{ServerName: tc.sni, RootCAs: e.pool}
			if tc.sni == "" {
				cfg.InsecureSkipVerify = true
			}
			tc2 := tls.Client(c, cfg)
			tc2.SetDeadline(time.Now().Add(5 * time.Second))
			err := tc2.Handshake()
			if err == nil || !strings.Contains(err.Error(), "access denied") {
				t.Fatalf("handshake with SNI %q: %v", tc.sni, err)
			}
			if _, ok := e.waitFor(t, func(r Record) bool { return r.Reason == tc.reason && r.Decision == DecisionDeny }); !ok {
				t.Errorf("no %s record in %+v", tc.reason, e.ring.Records(testSandbox, 0))
			}
		})
	}
}

func TestHostHeaderMismatch(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	// Plain HTTP: absolute URI for the allowed host, Host for another.
	c, err := net.Dial("tcp", e.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://allowed.test:%d/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", e.httpPort)
	status, body := readResponse(t, c)
	if !strings.Contains(status, "403") || !strings.Contains(body, "Host header") {
		t.Errorf("plain Host mismatch: %s %q", status, body)
	}
	// Inside a CONNECT tunnel.
	tc, st := e.rawConnect(t, fmt.Sprintf("allowed.test:%d", e.httpPort))
	if tc == nil {
		t.Fatal(st)
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	status, _ = readResponse(t, tc)
	if !strings.Contains(status, "403") {
		t.Errorf("tunnel Host mismatch: %s", status)
	}
	// Inside a tunnel, an absolute URI for another host is refused too.
	tc, _ = e.rawConnect(t, fmt.Sprintf("allowed.test:%d", e.httpPort))
	fmt.Fprintf(tc, "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	status, _ = readResponse(t, tc)
	if !strings.Contains(status, "403") {
		t.Errorf("tunnel absolute-URI mismatch: %s", status)
	}
	// And a matching Host inside the tunnel works.
	tc, _ = e.rawConnect(t, fmt.Sprintf("allowed.test:%d", e.httpPort))
	fmt.Fprintf(tc, "GET /ok HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", e.httpPort)
	status, body = readResponse(t, tc)
	if !strings.Contains(status, "200") || !strings.Contains(body, "host=allowed.test") {
		t.Errorf("tunnel with matching Host: %s %q", status, body)
	}
	if strings.Contains(e.up.all(), "evil.test") {
		t.Errorf("upstream saw a refused request: %s", e.up.all())
	}
}

func TestNestedConnectRefused(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	for _, pre := range []string{"", "\r\n"} {
		tc, st := e.rawConnect(t, fmt.Sprintf("allowed.test:%d", e.httpPort))
		if tc == nil {
			t.Fatal(st)
		}
		fmt.Fprintf(tc, "%sCONNECT evil.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", pre)
		status, body := readResponse(t, tc)
		if pre == "" && (!strings.Contains(status, "403") || !strings.Contains(body, "CONNECT inside a tunnel")) {
			t.Errorf("nested CONNECT: %s %q", status, body)
		}
		if pre != "" && strings.Contains(status, "200") {
			t.Errorf("nested CONNECT after CRLF got through: %s", status)
		}
	}
	rs := e.waitRecords(t, 1)
	if rs[0].Reason != ReasonNestedConnect {
		t.Errorf("record %+v", rs[0])
	}
}

func TestPolicyChangeTakesEffect(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.tlsPort), "")
	c := e.client(false)
	u := fmt.Sprintf("https://allowed.test:%d/", e.tlsPort)
	if code, _, err := e.get(t, c, u); err != nil || code != 200 {
		t.Fatalf("before: %d %v", code, err)
	}
	e.allow(t, "other.test", "")
	if _, _, err := e.get(t, c, u); err == nil {
		t.Fatal("after policy change the old host still works")
	}
	e.allow(t, "*.test:"+fmt.Sprint(e.tlsPort), "allowed.test")
	if _, _, err := e.get(t, c, u); err == nil {
		t.Fatal("deny rule did not win over the wildcard")
	}
	if code, _, err := e.get(t, c, fmt.Sprintf("https://other.test:%d/", e.tlsPort)); err != nil || code != 200 {
		t.Fatalf("wildcard allow: %d %v", code, err)
	}
	e.p.RemoveSandbox(testSandbox)
	if _, _, err := e.get(t, c, u); err == nil {
		t.Fatal("removed sandbox still has egress")
	}
}

func TestSecretInjection(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d,allowed.test:%d,allowed.test:%d", e.tlsPort, e.tlsPort, e.httpPort), "")
	const value = "s3cr3t-VALUE-9f8e7d"
	phTok, phBasic, phQuery, phOther := NewPlaceholder(), NewPlaceholder(), NewPlaceholder(), NewPlaceholder()
	err := e.p.BindSecrets(testSandbox, map[string]Secret{
		phTok:   {Name: "GITHUB_TOKEN", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}},
		phBasic: {Name: "GIT_PASS", Value: []byte(value + "-basic"), Hosts: []string{"*.secret.test", e.secretHost()}, Inject: Injection{BasicAuth: &BasicAuth{User: "x-access-token"}}},
		phQuery: {Name: "API_KEY", Value: []byte(value + "&q"), Hosts: []string{e.secretHost()}, Inject: Injection{QueryParam: "key"}},
		phOther: {Name: "OTHER", Value: []byte("other-value-123"), Hosts: []string{"nowhere.test"}, Inject: Injection{Header: "X-Token"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := e.client(true)
	base := fmt.Sprintf("https://secret.test:%d", e.tlsPort)

	// The upstream gets the value; its echo comes back scrubbed (the
	// placeholder where the value was: TestSecretReflection).
	code, body, err := e.get(t, c, base+"/user", "Authorization", "Bearer "+phTok)
	if err != nil || code != 200 || !strings.Contains(body, "auth=Bearer "+phTok+" ") || !strings.Contains(e.up.all(), "auth=Bearer "+value+" ") {
		t.Fatalf("bearer injection: %d %q %v", code, body, err)
	}
	code, body, _ = e.get(t, c, base+"/user", "Authorization", phTok) // bare placeholder gets the format
	if code != 200 || !strings.Contains(body, "auth=Bearer "+phTok+" ") || strings.Count(e.up.all(), "auth=Bearer "+value+" ") != 2 {
		t.Errorf("format injection: %d %q", code, body)
	}
	req, _ := http.NewRequest("GET", base+"/repo.git/info/refs", nil)
	req.SetBasicAuth("someone", phBasic)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "auth=Basic " + basicB64("x-access-token", value+"-basic")
	if !strings.Contains(e.up.all(), want+" ") || !strings.Contains(string(b), "auth=Basic "+basicB64("x-access-token", phBasic)+" ") {
		t.Errorf("basic injection: %q want %q", b, want)
	}
	code, body, _ = e.get(t, c, base+"/q?a=1&key="+phQuery)
	if code != 200 || !strings.Contains(e.up.all(), "query=a=1&key=s3cr3t-VALUE-9f8e7d%26q ") || !strings.Contains(body, "query=a=1&key="+phQuery+" ") {
		t.Errorf("query injection: %d %q", code, body)
	}
	// Chunked request body through the interception, on the same tunnel.
	pr, pw := io.Pipe()
	go func() { pw.Write(make([]byte, 100000)); pw.Close() }()
	req, _ = http.NewRequest("POST", base+"/upload", pr)
	req.Header.Set("Authorization", "Bearer "+phTok)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "body=100000") || len(resp.TransferEncoding) != 0 && resp.TransferEncoding[0] != "chunked" {
		t.Errorf("chunked upload: %q", b)
	}
	// A large response.
	code, body, _ = e.get(t, c, base+"/big?size=3000000")
	if code != 200 || len(body) != 3000000 {
		t.Errorf("big download: %d %d", code, len(body))
	}

	// Leaks: a placeholder of a secret not bound to secret.test (intercepted).
	code, body, _ = e.get(t, c, base+"/x", "X-Token", phOther)
	if code != 403 || !strings.Contains(body, "placeholder") {
		t.Errorf("leak in intercepted tunnel: %d %q", code, body)
	}
	// ... and any placeholder over plain HTTP.
	code, _, _ = e.get(t, c, fmt.Sprintf("http://allowed.test:%d/?t=%s", e.httpPort, phTok))
	if code != 403 {
		t.Errorf("leak over plain HTTP: %d", code)
	}
	// ... and in the CONNECT host.
	if _, st := e.rawConnect(t, phTok+".allowed.test:443"); !strings.Contains(st, "403") {
		t.Errorf("placeholder in CONNECT host: %s", st)
	}
	seen := e.up.all()
	if strings.Contains(seen, phOther) || strings.Contains(seen, phTok) || strings.Contains(seen, "other-value") {
		t.Errorf("upstream saw a leaked placeholder:\n%s", seen)
	}
	c.CloseIdleConnections()

	e.waitFor(t, func(r Record) bool { return r.Method == "CONNECT" && r.Host == "secret.test" })
	rs := e.ring.Records(testSandbox, 0)
	var leaks, used int
	for _, r := range rs {
		if r.Reason == ReasonLeak {
			leaks++
		}
		if r.Secret == "GITHUB_TOKEN" && r.Decision == DecisionAllow && r.Method != "CONNECT" {
			used++
		}
	}
	if leaks != 3 || used != 3 {
		t.Errorf("leaks=%d used=%d in %+v", leaks, used, rs)
	}
	if tun, _ := e.waitFor(t, func(r Record) bool { return r.Method == "CONNECT" && r.Host == "secret.test" }); tun.Secret != "API_KEY,GITHUB_TOKEN,GIT_PASS" || tun.BytesDown < 3000000 {
		t.Errorf("tunnel record %+v", tun)
	}

	// The value appears nowhere: logs, audit, errors, fmt, JSON.
	sec := Secret{Name: "GITHUB_TOKEN", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}
	e.p.log.Info("a secret", "secret", sec)
	ab, _ := json.Marshal(rs)
	sb, _ := json.Marshal(sec)
	dump := e.logs.String() + string(ab) + string(sb) + fmt.Sprintf("%v %+v %#v %s", sec, sec, sec, sec)
	for _, v := range []string{value, "other-value-123", basicB64("x-access-token", value+"-basic")} {
		if strings.Contains(dump, v) {
			t.Fatalf("secret value %q found in logs/audit/fmt:\n%s", v, dump)
		}
	}
	if !strings.Contains(e.logs.String(), `"secret":{"name":"GITHUB_TOKEN"`) {
		t.Errorf("LogValuer not used: %s", e.logs.String())
	}
}

func TestSecretBindingInterceptsEveryTLSTunnel(t *testing.T) {
	// With secrets bound, every TLS tunnel — to unrelated hosts and on any
	// port — is intercepted so a placeholder sent there is seen; without
	// secrets it passes through.
	e := newEnv(t)
	if (&session{p: e.p, sb: testSandbox}).intercepts("allowed.test", 443) {
		t.Error("intercepting without secrets")
	}
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "T", Value: []byte("v"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "X-T"}}}); err != nil {
		t.Fatal(err)
	}
	s := &session{p: e.p, sb: testSandbox}
	if !s.intercepts("allowed.test", 443) || !s.intercepts("secret.test", 8443) || !s.intercepts("allowed.test", 8443) {
		t.Error("interception choice wrong")
	}
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{"space_ph_short": {Name: "T", Value: []byte("v"), Hosts: []string{"a.test"}, Inject: Injection{Header: "X"}}}); err == nil {
		t.Error("malformed placeholder accepted")
	}
}

func TestUpstreamCertificateVerified(t *testing.T) {
	// RootCAs without the upstream CA: intercepted requests fail closed.
	e := newEnv(t, func(c *Config) { c.RootCAs = nil })
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	ph := NewPlaceholder()
	e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "T", Value: []byte("value-xyz"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}})
	code, _, err := e.get(t, e.client(false), fmt.Sprintf("https://secret.test:%d/", e.tlsPort), "Authorization", ph)
	if err != nil || code != 502 {
		t.Errorf("untrusted upstream: %d %v", code, err)
	}
	if strings.Contains(e.up.all(), "value-xyz") {
		t.Error("value sent to an unverified upstream")
	}
}

func TestIPLiteralCIDRRuleEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("127.0.0.1:%d", e.httpPort), "")
	code, _, err := e.get(t, e.client(false), fmt.Sprintf("http://127.0.0.1:%d/", e.httpPort))
	if err != nil || code != 200 {
		t.Errorf("CIDR-allowed literal: %d %v", code, err)
	}
	code, _, _ = e.get(t, e.client(false), fmt.Sprintf("http://2130706433:%d/", e.httpPort))
	if code != 200 {
		// The decimal form is the same address and the CIDR allows it.
		t.Errorf("decimal literal within the CIDR: %d", code)
	}
	code, _, _ = e.get(t, e.client(false), fmt.Sprintf("http://127.0.0.2:%d/", e.httpPort))
	if code != 403 {
		t.Errorf("literal outside the CIDR rule: %d", code)
	}
}

func TestServeConnEndsWithContext(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.p.ServeConn(ctx, testSandbox, b); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not end with its context")
	}
	a.Close()
}

func TestDecideNeverResolvesRefused(t *testing.T) {
	res := &countingResolver{fn: func(string, int) []net.IP { return []net.IP{net.ParseIP("93.184.216.34")} }}
	p, _ := New(Config{Resolver: res})
	pol, _ := ParsePolicy("a.test", "")
	p.SetPolicy("s", pol)
	for _, h := range []string{"b.test", "a.test.evil", "127.0.0.1", "2130706433", "x." + NewPlaceholder()} {
		if d := p.decide(context.Background(), "s", h, 443); d.allow {
			t.Errorf("%s allowed", h)
		}
	}
	if res.total() != 0 {
		t.Errorf("resolved %d times", res.total())
	}
	if d := p.decide(context.Background(), "s", "A.TEST.", 443); !d.allow || d.addrs[0] != netip.MustParseAddr("93.184.216.34") {
		t.Errorf("a.test: %+v", d)
	}
}

func TestStreamedResponseNotHeldBack(t *testing.T) {
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first\n"))
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("second\n"))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	defer close(release)
	e := newEnv(t)
	port := ln.Addr().(*net.TCPAddr).Port
	e.allow(t, fmt.Sprintf("allowed.test:%d", port), "")
	resp, err := e.client(false).Get(fmt.Sprintf("http://allowed.test:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("first chunk: %q %v", buf, err)
	}
}

func TestSlowTLSClientStillIntercepted(t *testing.T) {
	// A client that takes longer than SniffTimeout to send its ClientHello
	// (Python loading a CA bundle on a loaded host) must still have its TLS
	// intercepted when the sandbox holds secrets: being slow never turns a
	// tunnel into a raw relay that bypasses the placeholder checks.
	e := newEnv(t)
	target := fmt.Sprintf("secret.test:%d", e.tlsPort)
	e.allow(t, target, "")
	const value = "slow-client-value-42"
	ph := NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{ph: {Name: "T", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization"}}}); err != nil {
		t.Fatal(err)
	}
	c, st := e.rawConnect(t, target)
	if c == nil {
		t.Fatalf("CONNECT: %s", st)
	}
	time.Sleep(3 * e.p.cfg.SniffTimeout)
	tc := tls.Client(c, &tls.Config{ServerName: "secret.test", RootCAs: e.pool})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if issuer := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; issuer != "space egress CA "+testSandbox {
		t.Fatalf("slow client's tunnel not intercepted: leaf issued by %q", issuer)
	}
	fmt.Fprintf(tc, "GET /slow HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", target, ph)
	b, _ := io.ReadAll(tc)
	if !strings.Contains(e.up.all(), "auth="+value+" ") || !strings.Contains(string(b), "auth="+ph+" ") {
		t.Errorf("secret not injected through a slow client's tunnel: %q", b)
	}
}

func TestServerSpeaksFirstRelayedRaw(t *testing.T) {
	// An upstream that speaks first (an ssh or smtp banner) gets a raw
	// tunnel, with or without secrets bound: the client may wait for it.
	port := echoServer(t, "SSH-2.0-banner\r\n")
	for _, secrets := range []bool{false, true} {
		e := newEnv(t)
		target := fmt.Sprintf("allowed.test:%d", port)
		e.allow(t, target, "")
		if secrets {
			e.p.BindSecrets(testSandbox, map[string]Secret{NewPlaceholder(): {Name: "T", Value: []byte("v"), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "X-T"}}})
		}
		c, st := e.rawConnect(t, target)
		if c == nil {
			t.Fatalf("CONNECT: %s", st)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		if l, err := br.ReadString('\n'); err != nil || l != "SSH-2.0-banner\r\n" {
			t.Fatalf("secrets=%v: banner %q %v", secrets, l, err)
		}
		io.WriteString(c, "SSH-2.0-client\r\n")
		if l, err := br.ReadString('\n'); err != nil || l != "SSH-2.0-client\r\n" {
			t.Fatalf("secrets=%v: echo %q %v", secrets, l, err)
		}
	}
}

// TestSecretReflection: a host holding a secret that sends it back (a
// redirect keeping the query, a header or body echo, gzip, a long body with
// the value across read boundaries) gives the sandbox only the
// placeholder; a body the proxy cannot read is refused, not passed on.
func TestSecretReflection(t *testing.T) {
	e := newEnv(t)
	e.allow(t, fmt.Sprintf("secret.test:%d", e.tlsPort), "")
	const value = "QSECRET_A_456-reflected"
	phTok, phQuery := NewPlaceholder(), NewPlaceholder()
	if err := e.p.BindSecrets(testSandbox, map[string]Secret{
		phTok:   {Name: "TOK", Value: []byte(value), Hosts: []string{e.secretHost()}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}},
		phQuery: {Name: "QTOK", Value: []byte(value + "/q"), Hosts: []string{e.secretHost()}, Inject: Injection{QueryParam: "key"}},
	}); err != nil {
		t.Fatal(err)
	}
	c := e.client(true)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	base := fmt.Sprintf("https://secret.test:%d", e.tlsPort)
	do := func(path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+phTok)
		req.Header.Set("Accept-Encoding", "gzip") // asked for; the proxy asks upstream for identity
		resp, err := c.Transport.RoundTrip(req)   // no transparent decompression
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	leaked := func(what, s string) {
		t.Helper()
		if strings.Contains(s, "QSECRET") || strings.Contains(s, url.QueryEscape(value+"/q")) {
			t.Errorf("%s carries the secret: %q", what, s)
		}
	}
	// A header's name is scrubbed too.
	if resp, _ := do("/n?name=1"); true {
		for k := range resp.Header {
			leaked("header name", k)
			leaked("header name", strings.ToUpper(k))
		}
		if resp.Header.Get("X-Name-"+phTok) != "1" { // the name is canonical: its case does not matter
			t.Errorf("the echoed header's name does not carry the placeholder: %v", resp.Header)
		}
	}
	// A trailer (after a chunked body) is scrubbed as a header is.
	if resp, body := do("/t?trailer=1"); resp.Trailer.Get("X-Echo-Trailer") != "Bearer "+phTok {
		t.Errorf("trailer %q (body %q), want the placeholder", resp.Trailer.Get("X-Echo-Trailer"), body)
	}
	resp, body := do("/r?redirect=1&key=" + phQuery)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != 301 || !strings.Contains(loc, "key="+phQuery) {
		t.Errorf("redirect: %d Location %q", resp.StatusCode, loc)
	}
	leaked("Location", loc)
	leaked("redirect body", body)
	if got := resp.Header.Get("X-Echo-Auth"); got != "Bearer "+phTok {
		t.Errorf("echoed header %q", got)
	}
	_, body = do("/plain")
	if !strings.Contains(body, "auth=Bearer "+phTok+" ") {
		t.Errorf("echoed body %q", body)
	}
	leaked("body", body)
	resp, body = do("/z?encoding=gzip")
	if resp.Header.Get("Content-Encoding") != "" || !strings.Contains(body, "auth=Bearer "+phTok+" ") {
		t.Errorf("gzip echo: %v %q", resp.Header, body)
	}
	leaked("gzip body", body)
	// 5,000 echoes (~1 MB) with its Content-Length: every copy scrubbed,
	// however the reads cut it, and the body re-framed.
	resp, body = do("/long?repeat=5000")
	if n := strings.Count(body, "auth=Bearer "+phTok+" "); n != 5000 || resp.ContentLength != -1 {
		t.Errorf("long echo: %d scrubbed copies of 5000, length %d", n, resp.ContentLength)
	}
	leaked("long body", body)
	resp, body = do("/b?encoding=br")
	if resp.StatusCode != 502 || resp.Header.Get("X-Space-Egress") != ReasonEncoded {
		t.Errorf("an encoding the proxy cannot read: %d %q", resp.StatusCode, body)
	}
	leaked("refused body", body)
	if !strings.Contains(e.up.all(), "auth=Bearer "+value+" ") {
		t.Errorf("the upstream did not get the value:\n%s", e.up.all())
	}
	e.waitFor(t, func(r Record) bool { return r.Reason == ReasonEncoded })
}

func TestScrubReaderBoundaries(t *testing.T) {
	sc := &scrubber{}
	for _, n := range []string{"needle-long-one", "needle", "edle-lo"} {
		sc.needles = append(sc.needles, needle{core: []byte(n), repl: []byte("<" + strings.ToUpper(n[:2]) + ">")})
		sc.max = max(sc.max, len(n))
	}
	in := strings.Repeat("xx needle-long-one yy needle zz needl", 50) + "e"
	want := string(sc.replace([]byte(in)))
	for _, step := range []int{1, 2, 3, 5, 7, 16, 1000} {
		r := &scrubReader{sc: sc, r: iotest.OneByteReader(strings.NewReader(in)), c: io.NopCloser(nil)}
		if step > 1 {
			r.r = &stepReader{s: in, n: step}
		}
		got, err := io.ReadAll(r)
		if err != nil || string(got) != want {
			t.Fatalf("reads of %d: %v\n got %q\nwant %q", step, err, got, want)
		}
	}
}

type stepReader struct {
	s string
	n int
}

func (r *stepReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.s)
	r.s = r.s[n:]
	return n, nil
}

// TestScrubBasicAuthAnyUser: a basic-auth secret injected under a user the
// sandbox chose (the secret names none, or the placeholder sits inside a
// longer password) is scrubbed from an echo however the user aligns it in
// the base64: only the credential under the secret's own user was, so an
// endpoint echoing the Authorization header handed the sandbox the value.
func TestScrubBasicAuthAnyUser(t *testing.T) {
	const value = "s3cret-basic-VALUE-0123456789"
	ph := NewPlaceholder()
	pr, err := parseRule("h.test")
	if err != nil {
		t.Fatal(err)
	}
	r, err := compileRule(pr, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &boundSecret{placeholder: ph, hosts: []*rule{r}, secret: Secret{Name: "B", Value: []byte(value), Hosts: []string{"h.test"}, Inject: Injection{BasicAuth: &BasicAuth{}}}}
	sc := newScrubber([]*boundSecret{b}, "h.test")
	for _, cred := range []string{"u:" + value, "ab:" + value, "abc:" + value, "x-access-token:A" + value + "B", ":" + value} {
		echo := []byte(`{"authorization": "Basic ` + base64.StdEncoding.EncodeToString([]byte(cred)) + `"}`)
		out := string(sc.replace(echo))
		_, enc, _ := strings.Cut(out, "Basic ")
		enc, _, _ = strings.Cut(enc, `"`)
		dec, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			t.Errorf("%q: the scrubbed credential %q is no longer base64: %v", cred, enc, err)
		}
		if strings.Contains(string(dec), value) || strings.Contains(out, value) {
			t.Errorf("%q: the echo still carries the value: %q", cred, dec)
		}
	}
}

// TestPeekHeadDripped: a request head read a byte at a time is found
// whole, its end split over reads in every way, with a scan that resumes
// where the last one stopped (from the start each time, a dripped 32 KiB
// head cost half a second of the server's CPU).
func TestPeekHeadDripped(t *testing.T) {
	for _, head := range []string{
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\nHost: a.test\n\n",
		"GET / HTTP/1.1\r\nX: " + strings.Repeat("y", 20000) + "\r\n\r\n",
	} {
		br := bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader(head+"BODY")), 32<<10)
		got, err := peekHead(br)
		if err != nil || string(got) != head {
			t.Errorf("head of %d bytes: got %d bytes, %v", len(head), len(got), err)
		}
	}
	br := bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader("GET / HTTP/1.1\r\nX: "+strings.Repeat("y", 40000))), 32<<10)
	if _, err := peekHead(br); !errors.Is(err, errHeadTooLarge) {
		t.Errorf("a head past the buffer: %v", err)
	}
}

// TestConnLimitAndSilentUpstreams: a sandbox has at most MaxConns
// connections to the proxy (the next is a 503 naming the limit), and its
// removal (the sandbox's end) closes the upstreams of its tunnels and
// plain requests, also silent ones that never answer: they held a host
// socket and two goroutines for good, past the sandbox's end.
func TestConnLimitAndSilentUpstreams(t *testing.T) {
	ups := &closeRecorder{}
	e := newEnv(t, func(c *Config) { c.MaxConns = 3; c.Dialer = ups })
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			go io.Copy(io.Discard, c) // never writes, never closes first
		}
	}()
	port := silent.Addr().(*net.TCPAddr).Port
	e.allow(t, fmt.Sprintf("allowed.test:%d", port), "")
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", e.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A tunnel, the client half-closing its side (the upstream stays
	// silent), and a plain request waiting for an answer.
	tun := dial()
	fmt.Fprintf(tun, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", port, port)
	if resp, err := http.ReadResponse(bufio.NewReader(tun), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tun.Write([]byte("hello"))
	tun.(*net.TCPConn).CloseWrite()
	req := dial()
	fmt.Fprintf(req, "GET http://allowed.test:%d/ HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", port, port)
	idle := dial() // a third connection, waiting for its request
	_ = idle
	var limited *http.Response
	for range 50 {
		c := dial()
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			limited = resp
			break
		}
		c.Close() // not refused: the three before are not all in yet
	}
	if limited == nil || limited.Header.Get("X-Space-Egress") != ReasonConnLimit {
		t.Fatalf("a connection past MaxConns: %+v", limited)
	}
	waitCond(t, "both upstreams dialled", func() bool { n, _ := ups.counts(); return n == 2 })
	e.p.RemoveSandbox(testSandbox)
	waitCond(t, "the silent upstreams to be closed after the sandbox's removal", func() bool { n, closed := ups.counts(); return closed == n })
}

// closeRecorder dials like net.Dialer and counts the connections it made
// and those closed.
type closeRecorder struct {
	mu            sync.Mutex
	dialed, ended int
}

func (r *closeRecorder) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.dialed++
	r.mu.Unlock()
	return &recordedConn{Conn: c, r: r}, nil
}

func (r *closeRecorder) counts() (dialed, closed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dialed, r.ended
}

type recordedConn struct {
	net.Conn
	r    *closeRecorder
	once sync.Once
}

func (c *recordedConn) Close() error {
	c.once.Do(func() { c.r.mu.Lock(); c.r.ended++; c.r.mu.Unlock() })
	return c.Conn.Close()
}

func (c *recordedConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPolicyChangeClosesOpenConnections: taking a destination off a
// sandbox's policy closes the connections already open to it (raw tunnels,
// an IP literal's, a plain-HTTP response being streamed), by name rule and
// by a deny CIDR on the dialed address, and leaves the ones still allowed.
func TestPolicyChangeClosesOpenConnections(t *testing.T) {
	port := echoServer(t, "")
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first\n"))
		w.(http.Flusher).Flush()
		<-release
	})}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(hl)
	t.Cleanup(func() { close(release); srv.Close() })
	hport := hl.Addr().(*net.TCPAddr).Port

	e := newEnv(t)
	e.allow(t, fmt.Sprintf("allowed.test:%d,other.test:%d,127.0.0.1/32:%d,allowed.test:%d", port, port, port, hport), "")
	open := func(target string) net.Conn {
		c, st := e.rawConnect(t, target)
		if c == nil {
			t.Fatalf("CONNECT %s: %s", target, st)
		}
		return c
	}
	alive := func(c net.Conn) bool {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		defer c.SetDeadline(time.Time{})
		if _, err := c.Write([]byte("\x01ping\n")); err != nil {
			return false
		}
		b := make([]byte, 6)
		_, err := io.ReadFull(c, b)
		return err == nil && string(b) == "\x01ping\n"
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		defer c.SetReadDeadline(time.Time{})
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	byName := open(fmt.Sprintf("allowed.test:%d", port))
	kept := open(fmt.Sprintf("other.test:%d", port))
	literal := open(fmt.Sprintf("127.0.0.1:%d", port))
	for i, c := range []net.Conn{byName, kept, literal} {
		if !alive(c) {
			t.Fatalf("tunnel %d does not echo", i)
		}
	}
	hc := e.client(false)
	hc.Timeout = 0 // the response is cut by the proxy or not at all
	resp, err := hc.Get(fmt.Sprintf("http://allowed.test:%d/", hport))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b := make([]byte, 6); func() bool { _, err := io.ReadFull(resp.Body, b); return err != nil }() {
		t.Fatal("no first chunk of the streamed response")
	}
	body := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); body <- err }()

	e.allow(t, fmt.Sprintf("other.test:%d", port), "")
	if !closed(byName) {
		t.Error("a tunnel to a host taken off the allow list stayed open")
	}
	if !closed(literal) {
		t.Error("a tunnel to an IP literal whose CIDR rule went stayed open")
	}
	select {
	case <-body:
	case <-time.After(5 * time.Second):
		t.Error("a plain-HTTP response from a host taken off the list kept streaming")
	}
	if !alive(kept) {
		t.Fatal("a tunnel the new policy still allows was closed")
	}
	// A deny CIDR covering the dialed address closes it too.
	e.allow(t, fmt.Sprintf("other.test:%d", port), "127.0.0.0/8")
	if !closed(kept) {
		t.Error("a tunnel to a now-denied address stayed open")
	}
	waitCond(t, "audit records of the closed tunnels", func() bool {
		n := 0
		for _, r := range e.ring.Records(testSandbox, 100) {
			if r.Method == http.MethodConnect && r.Decision == DecisionAllow && r.Reason == ReasonPolicyChanged {
				n++
			}
		}
		return n == 3
	})
}

// TestPolicyChangeDuringDial: a policy change that lands after a
// connection's decision but before its upstream is published (while it
// dials) still refuses it.
func TestPolicyChangeDuringDial(t *testing.T) {
	var e *env
	var d net.Dialer
	e = newEnv(t, func(c *Config) {
		c.Dialer = dialFunc(func(ctx context.Context, n, a string) (net.Conn, error) {
			pol, _ := ParsePolicy("", "")
			if err := e.p.SetPolicy(testSandbox, pol); err != nil {
				return nil, err
			}
			return d.DialContext(ctx, n, a)
		})
	})
	target := fmt.Sprintf("allowed.test:%d", e.tlsPort)
	e.allow(t, target, "")
	c, st := e.rawConnect(t, target)
	if c != nil || !strings.Contains(st, " 403 ") || !strings.Contains(st, "policy changed") {
		t.Fatalf("CONNECT while the policy changed: %q", st)
	}
	e.allow(t, fmt.Sprintf("allowed.test:%d", e.httpPort), "")
	code, _, err := e.get(t, e.client(false), fmt.Sprintf("http://allowed.test:%d/", e.httpPort))
	if err != nil || code != http.StatusForbidden {
		t.Fatalf("plain request while the policy changed: %d %v", code, err)
	}
}

// echoServer is a TCP server on loopback that sends banner first (if any)
// and then echoes what it reads; it returns its port.
func echoServer(t *testing.T, banner string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
				io.WriteString(c, banner)
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
