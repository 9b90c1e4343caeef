package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestEgressTools checks that the everyday tools of the built-in templates
// reach an allowed HTTPS destination through the egress proxy with their
// default configuration (Python requests, Node's fetch, git over smart
// HTTP, pip from a PEP 503 index), and that each one is refused a
// destination outside the policy without anything reaching it. Both proxy
// paths are covered: a sandbox without secrets has its TLS relayed as is
// (it must trust the upstream's CA itself), a sandbox with a secret has
// every TLS tunnel intercepted with its own CA. curl is covered by
// TestEgress. There is no internet: the upstream is a loopback server of
// this test, named by the operator flag --egress-hosts.
func TestEgressTools(t *testing.T) {
	const value = "tools-s3cr3t-never-inside"
	up := startToolsUpstream(t, "Bearer "+value)
	s := startServer(t, "", "--egress-hosts", "allowed.test=127.0.0.1,refused.test=127.0.0.1",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-root-ca", up.caFile, "--pool-size", "-1")
	var sec map[string]any
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "TOOLS_TOKEN", "value": value, "hosts": []string{fmt.Sprintf("allowed.test:%d", up.port)}, // a secret goes only to the ports it names
		"inject": map[string]string{"header": "Authorization", "format": "Bearer {value}"},
	}, &sec); code != 201 {
		t.Fatalf("put secret: %d %v", code, sec)
	}
	allowed := fmt.Sprintf("https://allowed.test:%d", up.port)
	refused := fmt.Sprintf("https://refused.test:%d", up.port)
	network := map[string]any{"allow": []string{fmt.Sprintf("allowed.test:%d", up.port)}}

	// Passthrough: base template, no secrets. Its TLS is relayed
	// untouched, so it fails until the sandbox trusts the upstream's CA.
	pass := s.create(map[string]any{"template": "base", "network": network})
	if r := toolExec(t, s, pass, "", "python3 -c 'import requests; requests.get(\""+allowed+"/untrusted\")' 2>&1"); r.ExitCode == 0 || !strings.Contains(r.Stdout, "CERTIFICATE_VERIFY_FAILED") {
		t.Fatalf("passthrough TLS before trusting the upstream CA: %+v", r)
	}
	if r := toolExec(t, s, pass, "root", "cat >> /etc/ssl/certs/ca-certificates.crt", up.caPEM); r.ExitCode != 0 {
		t.Fatalf("install the upstream CA: %+v", r)
	}
	// Intercepted: python-data (it has pip), with a secret bound.
	s.buildTemplate("python-data")
	icpt := s.create(map[string]any{"template": "python-data", "network": network, "secrets": []string{"TOOLS_TOKEN"}})
	sandboxes := []struct{ name, id string }{{"passthrough", pass}, {"intercepted", icpt}}
	// auth is what the upstream reports: the placeholder is swapped for the
	// value only in intercepted tunnels.
	auth := map[string]string{pass: "auth=none", icpt: "auth=valid"}

	t.Run("requests", func(t *testing.T) {
		const py = `import os, sys, requests
tok = os.environ.get("TOOLS_TOKEN")
r = requests.get(sys.argv[1], headers={"Authorization": "Bearer " + tok} if tok else {}, timeout=60)
print(r.status_code, r.text.strip())
sys.exit(0 if r.ok else 2)`
		for _, sb := range sandboxes {
			r := toolExec(t, s, sb.id, "", []string{"python3", "-c", py, allowed + "/requests"})
			if r.ExitCode != 0 || !strings.Contains(r.Stdout, "tool-echo host=allowed.test") || !strings.Contains(r.Stdout, auth[sb.id]) {
				t.Errorf("%s: requests to the allowed host: %+v", sb.name, r)
			}
		}
		if r := toolExec(t, s, pass, "", []string{"python3", "-c", py, refused + "/requests"}); r.ExitCode == 0 || strings.Contains(r.Stdout, "tool-echo") {
			t.Errorf("requests to a refused host: %+v", r)
		}
		// NO_PROXY: loopback inside the sandbox goes direct.
		const local = `import http.server, threading, requests
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"local-ok")
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(requests.get("http://127.0.0.1:%d/" % srv.server_port, timeout=10).text)`
		if r := toolExec(t, s, pass, "", []string{"python3", "-c", local}); r.ExitCode != 0 || !strings.Contains(r.Stdout, "local-ok") {
			t.Errorf("requests to the sandbox's own loopback: %+v", r)
		}
	})

	t.Run("node-fetch", func(t *testing.T) {
		const js = `const tok = process.env.TOOLS_TOKEN;
fetch(process.argv[1], {headers: tok ? {authorization: 'Bearer ' + tok} : {}})
  .then(r => r.text().then(t => { console.log(r.status, t.trim()); if (!r.ok) process.exit(2); }));`
		for _, sb := range sandboxes {
			r := toolExec(t, s, sb.id, "", []string{"node", "-e", js, allowed + "/node"})
			if r.ExitCode != 0 || !strings.Contains(r.Stdout, "tool-echo host=allowed.test") || !strings.Contains(r.Stdout, auth[sb.id]) {
				t.Errorf("%s: node fetch to the allowed host: %+v", sb.name, r)
			}
		}
		if r := toolExec(t, s, pass, "", []string{"node", "-e", js, refused + "/node"}); r.ExitCode == 0 || strings.Contains(r.Stdout, "tool-echo") {
			t.Errorf("node fetch to a refused host: %+v", r)
		}
		// The per-sandbox CA is trusted through NODE_EXTRA_CA_CERTS alone
		// (the system store emptied), and nothing else trusts it then.
		noSystem := "SSL_CERT_FILE=/nonexistent SSL_CERT_DIR=/nonexistent "
		if r := toolExec(t, s, icpt, "", noSystem+`node -e "fetch('`+allowed+`/extra-ca').then(r=>r.text()).then(console.log)"`); r.ExitCode != 0 || !strings.Contains(r.Stdout, "path=/extra-ca") {
			t.Errorf("node trusting the sandbox CA via NODE_EXTRA_CA_CERTS: %+v", r)
		}
		if r := toolExec(t, s, icpt, "", noSystem+`NODE_EXTRA_CA_CERTS= node -e "fetch('`+allowed+`/no-ca').then(r=>r.text()).then(console.log)"`); r.ExitCode == 0 || strings.Contains(r.Stdout, "path=/no-ca") {
			t.Errorf("node connected with no CA configured at all: %+v", r)
		}
		// Loopback goes direct, not to the proxy.
		const local = `const s = require('http').createServer((q, r) => r.end('local-ok')).listen(0, '127.0.0.1', () =>
  fetch('http://127.0.0.1:' + s.address().port + '/').then(r => r.text()).then(t => { console.log(t); s.close(); }));`
		if r := toolExec(t, s, pass, "", []string{"node", "-e", local}); r.ExitCode != 0 || !strings.Contains(r.Stdout, "local-ok") {
			t.Errorf("node fetch to the sandbox's own loopback: %+v", r)
		}
	})

	t.Run("git", func(t *testing.T) {
		if !up.git {
			t.Skip("host git not found: no smart-HTTP upstream to clone from")
		}
		clone := fmt.Sprintf("rm -rf /tmp/clone && GIT_TERMINAL_PROMPT=0 git clone -q %s/git/repo.git /tmp/clone 2>&1 && cat /tmp/clone/hello.txt", allowed)
		for _, sb := range sandboxes {
			// Known issue: git's libcurl-gnutls sometimes rejects the
			// intercepted chain ("server certificate verification failed")
			// on a loaded host; OpenSSL clients never do. Up to three tries
			// on that error only, each one logged.
			var r execResult
			for try := 1; try <= 3; try++ {
				if r = toolExec(t, s, sb.id, "", clone); r.ExitCode == 0 || !strings.Contains(r.Stdout, "certificate verification failed") {
					break
				}
				t.Logf("%s: git clone, try %d: %s", sb.name, try, r.Stdout)
			}
			if r.ExitCode != 0 || !strings.Contains(r.Stdout, "hello from the e2e upstream") {
				t.Errorf("%s: git clone over HTTPS: %+v", sb.name, r)
			}
		}
		if r := toolExec(t, s, pass, "", fmt.Sprintf("GIT_TERMINAL_PROMPT=0 git clone -q %s/git/repo.git /tmp/refused 2>&1", refused)); r.ExitCode == 0 {
			t.Errorf("git clone from a refused host: %+v", r)
		}
	})

	t.Run("pip", func(t *testing.T) {
		pip := "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --retries 0 --timeout 60 --user --break-system-packages --index-url %s/simple/ spacetoolpkg 2>&1"
		r := toolExec(t, s, icpt, "", fmt.Sprintf(pip, allowed)+" && python3 -c 'import spacetoolpkg; print(spacetoolpkg.VALUE)'")
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, "from-the-index") {
			t.Errorf("pip install from the index: %+v", r)
		}
		if r := toolExec(t, s, icpt, "", "python3 -m pip uninstall -y -q --break-system-packages spacetoolpkg 2>&1; "+fmt.Sprintf(pip, refused)); r.ExitCode == 0 {
			t.Errorf("pip install from a refused host: %+v", r)
		}
	})

	// Nothing of the refused destination reached the upstream, and each
	// sandbox's audit log has the refusals.
	if got := up.seen("refused.test"); len(got) > 0 {
		t.Errorf("the refused host reached the upstream: %v", got)
	}
	for _, sb := range sandboxes {
		var audit struct {
			Records []struct{ Host, Decision string }
		}
		s.do("GET", "/v1/sandboxes/"+sb.id+"/egress", s.key, nil, &audit)
		var allow, deny bool
		for _, rec := range audit.Records {
			allow = allow || rec.Host == "allowed.test" && rec.Decision == "allow"
			deny = deny || rec.Host == "refused.test" && rec.Decision == "deny"
		}
		if !allow || !deny {
			t.Errorf("%s: audit has allowed %v, refused %v: %+v", sb.name, allow, deny, audit.Records)
		}
	}
}

// toolExec runs cmd (a shell string or an argv) as user (default "user")
// with optional stdin. It reports API failures on t itself, so subtests
// can use it.
func toolExec(t *testing.T, s *server, id, user string, cmd any, stdin ...string) execResult {
	t.Helper()
	body := map[string]any{"cmd": cmd, "timeout_s": 300}
	if user != "" {
		body["user"] = user
	}
	if len(stdin) > 0 {
		body["stdin"] = stdin[0]
	}
	j, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+id+"/exec", bytes.NewReader(j))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("exec %v: %v", cmd, err)
	}
	defer resp.Body.Close()
	var r execResult
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(data, &r) != nil {
		t.Fatalf("exec %v: %d %s", cmd, resp.StatusCode, data)
	}
	return r
}

// toolsUpstream is a loopback HTTPS server with its own CA (certificate
// for allowed.test and refused.test) serving an echo, a git repository
// over smart HTTP and a PEP 503 package index, and remembering every TLS
// server name and Host it was asked for.
type toolsUpstream struct {
	port          int
	caFile, caPEM string
	git           bool // host git found: /git/repo.git is served

	mu    sync.Mutex
	names []string
}

func (u *toolsUpstream) saw(name string) {
	u.mu.Lock()
	u.names = append(u.names, name)
	u.mu.Unlock()
}

// seen returns the server names and Hosts received that contain sub.
func (u *toolsUpstream) seen(sub string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, n := range u.names {
		if strings.Contains(n, sub) {
			out = append(out, n)
		}
	}
	return out
}

func startToolsUpstream(t *testing.T, wantAuth string) *toolsUpstream {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e tools upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames: []string{"allowed.test", "refused.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, _ := x509.CreateCertificate(rand.Reader, leafTpl, ca, &key.PublicKey, caKey)
	u := &toolsUpstream{caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))}
	u.caFile = filepath.Join(t.TempDir(), "tools-ca.pem")
	if err := os.WriteFile(u.caFile, []byte(u.caPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			u.saw("sni:" + h.ServerName)
			return nil, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	u.port = ln.Addr().(*net.TCPAddr).Port

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a := r.Header.Get("Authorization")
		switch {
		case a == "":
			a = "none"
		case a == wantAuth:
			a = "valid"
		default:
			a = "invalid"
		}
		fmt.Fprintf(w, "tool-echo host=%s path=%s auth=%s\n", r.Host, r.URL.Path, a)
	})
	// A PEP 503 simple index with one pure-Python wheel.
	wheelName := "spacetoolpkg-1.0-py3-none-any.whl"
	wheel := buildWheel(t, "spacetoolpkg", "1.0", map[string]string{
		"spacetoolpkg/__init__.py": "VALUE = \"from-the-index\"\n",
	})
	sum := sha256.Sum256(wheel)
	mux.HandleFunc("/simple/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		switch strings.TrimSuffix(r.URL.Path, "/") {
		case "/simple":
			fmt.Fprint(w, `<!DOCTYPE html><html><body><a href="spacetoolpkg/">spacetoolpkg</a></body></html>`)
		case "/simple/spacetoolpkg":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%s">%s</a></body></html>`, wheelName, hex.EncodeToString(sum[:]), wheelName)
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("/files/"+wheelName, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	})
	// git over smart HTTP: git http-backend as CGI on a bare repository.
	if gitBin, err := exec.LookPath("git"); err == nil {
		root := t.TempDir()
		work := filepath.Join(root, "work")
		env := append(os.Environ(), "HOME="+root, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.test",
			"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.test")
		git := func(args ...string) {
			cmd := exec.Command(gitBin, args...)
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("git %v: %v: %s", args, err, out)
			}
		}
		git("init", "-q", work)
		if err := os.WriteFile(filepath.Join(work, "hello.txt"), []byte("hello from the e2e upstream\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		git("-C", work, "add", "hello.txt")
		git("-C", work, "commit", "-q", "-m", "init")
		git("clone", "-q", "--bare", work, filepath.Join(root, "repo.git"))
		mux.Handle("/git/", &cgi.Handler{Path: gitBin, Args: []string{"http-backend"}, Root: "/git",
			Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "HOME=" + root, "GIT_CONFIG_NOSYSTEM=1"}})
		u.git = true
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.saw("host:" + r.Host)
			mux.ServeHTTP(w, r)
		}),
		ErrorLog: log.New(io.Discard, "", 0), // refused handshakes are expected
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

// buildWheel makes a pure-Python wheel of files (path → content) with its
// dist-info (METADATA, WHEEL, RECORD with each file's hash).
func buildWheel(t *testing.T, name, version string, files map[string]string) []byte {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	all := map[string]string{
		info + "METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
		info + "WHEEL":    "Wheel-Version: 1.0\nGenerator: space-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	for p, c := range files {
		all[p] = c
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		w, err := zw.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, all[p])
		h := sha256.Sum256([]byte(all[p]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", p, base64.RawURLEncoding.EncodeToString(h[:]), len(all[p]))
	}
	record.WriteString(info + "RECORD,,\n")
	w, err := zw.Create(info + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
