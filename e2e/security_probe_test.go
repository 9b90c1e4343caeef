package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/security"
	space "github.com/spacesandbox/space/sdk/go"
)

// startProbeUpstream is the probe suite's allowed destination: a loopback
// HTTPS server with its own CA that echoes what it received, on
// /redirect?to=URL answers 302 to URL (the redirect-to-private probe), and
// switches to any protocol it is asked to (the upgrade-smuggle probe).
func startProbeUpstream(t *testing.T) (port int, caFile string) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e probe upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames:  []string{"allowed.test", "other.test", "unbound.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, _ := x509.CreateCertificate(rand.Reader, leafTpl, ca, &key.PublicKey, caKey)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if up := r.Header.Get("Upgrade"); up != "" {
			// A naive upstream (the upgrade-smuggle probe): it switches to
			// whatever it is asked for and then goes on reading HTTP, so
			// whatever the proxy lets through after the 101 is answered
			// (host names here are short: a one-byte frame length).
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", up)
			brw.Flush()
			for {
				req, err := http.ReadRequest(brw.Reader)
				if err != nil {
					return
				}
				// Answered in a WebSocket text frame, which the proxy
				// passes on to the client: what reached here is seen.
				msg := "smuggled host=" + req.Host
				brw.Write(append([]byte{0x81, byte(len(msg))}, msg...))
				brw.Flush()
			}
		}
		if to := r.URL.Query().Get("to"); r.URL.Path == "/redirect" && to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		fmt.Fprintf(w, "host=%s path=%s\n", r.Host, r.URL.Path)
	}), ErrorLog: log.New(io.Discard, "", 0)} // probes abort handshakes on purpose
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	caFile = filepath.Join(t.TempDir(), "probe-upstream-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	return ln.Addr().(*net.TCPAddr).Port, caFile
}

// TestSecurityProbe runs the shipped attack suite against a real server
// whose operator flags make loopback test names reachable (only for the
// test: other.test, unbound.test -> 127.0.0.1 and rebind.test -> 127.0.0.2,
// with 127.0.0.1/32 the one private range the proxy may dial).
func TestSecurityProbe(t *testing.T) {
	port, caFile := startProbeUpstream(t)
	s := startServer(t, "", "--egress-hosts", "allowed.test=127.0.0.1,other.test=127.0.0.1,unbound.test=127.0.0.1,rebind.test=127.0.0.2",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-root-ca", caFile, "--pool-size", "-1")
	allowed := fmt.Sprintf("allowed.test:%d", port)
	u, _ := url.Parse(s.url)
	var apiPort int
	fmt.Sscan(u.Port(), &apiPort)

	var e apiError
	if code := s.do("GET", "/v1/security/report", s.key, nil, &e); code != 404 {
		t.Fatalf("report before any run: %d %+v", code, e)
	}

	// Positive controls first, in process against the same API: a
	// deliberately permissive sandbox (allow "*": any name, any port) must
	// make the probes aimed at other.test and at other ports report
	// BYPASSED, so "blocked" below is a finding, not a blind spot.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	perm, err := security.Run(ctx, security.NewClientTarget(s.url, s.key), security.Options{
		Request:    security.Request{Allow: allowed, Forbidden: "other.test", Only: []string{"other-port", "dns-tcp", "hostname-tricks"}},
		ExtraAllow: []string{"*"}, APIPort: apiPort,
	})
	if err != nil {
		t.Fatalf("permissive run: %v", err)
	}
	t.Logf("permissive sandbox (positive control):\n%s", perm.Table())
	for _, r := range perm.Results {
		if r.Result != security.Bypassed {
			t.Errorf("permissive sandbox: probe %s = %s (%s), want BYPASSED: the detector cannot detect", r.ID, r.Result, r.Detail)
		}
	}
	for _, c := range perm.Controls {
		if c.Result != "ok" {
			t.Errorf("control %s: %s %s", c.ID, c.Result, c.Detail)
		}
	}

	// The real run, through the API, as an operator would.
	req := space.SecurityProbeRequest{Allow: allowed, Forbidden: "other.test", Unbound: "unbound.test", Rebind: "rebind.test"}
	client := space.NewClient(s.url, s.key)
	rep, err := client.RunSecurityProbe(ctx, req)
	if err != nil {
		t.Fatalf("POST /v1/security/probe: %v", err)
	}
	t.Logf("suite:\n%s", rep.Table())
	if rep.Probes < 25 || rep.Probes != len(rep.Results) {
		t.Errorf("probes = %d (results %d), want >= 25", rep.Probes, len(rep.Results))
	}
	for _, r := range rep.Results {
		// An error hides what happened: it fails the test like a bypass.
		if r.Result != security.Blocked {
			t.Errorf("probe %s: %s: %s", r.ID, r.Result, r.Detail)
		}
	}
	if rep.Bypassed != 0 || rep.Errors != 0 {
		t.Errorf("bypassed %d, errors %d", rep.Bypassed, rep.Errors)
	}
	if len(rep.Controls) != 2 {
		t.Errorf("controls: %+v", rep.Controls)
	}
	for _, c := range rep.Controls {
		if c.Result != "ok" {
			t.Errorf("control %s failed (blocked results would be meaningless): %s", c.ID, c.Detail)
		}
	}
	last, err := client.SecurityReport(ctx)
	if err != nil || !last.Started.Equal(rep.Started) || last.Probes != rep.Probes {
		t.Errorf("GET /v1/security/report: %v %+v", err, last)
	}
	// Admin only.
	var key struct {
		Key string `json:"key"`
	}
	if code := s.do("POST", "/v1/keys", s.key, map[string]any{"team": "t1", "name": "t1"}, &key); code == 201 && key.Key != "" {
		if code := s.do("GET", "/v1/security/report", key.Key, nil, &e); code != 403 {
			t.Errorf("team key reading the security report: %d", code)
		}
	}

	// The CLI: prints the table, last line "N probes, 0 bypassed", exit 0.
	cmd := exec.CommandContext(ctx, spaceBin(t), "--url", s.url, "--api-key", s.key, "security", "probe", "--allow", allowed)
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	lastLine := lines[len(lines)-1]
	var n, m int
	if _, serr := fmt.Sscanf(lastLine, "%d probes, %d bypassed", &n, &m); serr != nil || n < 25 || m != 0 || err != nil {
		t.Errorf("space security probe: %v, last line %q:\n%s", err, lastLine, out)
	}
	if r, err := client.SecurityReport(ctx); err != nil || r.Started.Equal(rep.Started) {
		t.Errorf("report after the CLI run is not the CLI's: %v", err)
	}
}
