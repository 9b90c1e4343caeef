package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// upstream is a loopback HTTPS server with its own CA, answering every
// request with what it received, so tests see exactly what the proxy sent.
type upstream struct {
	port   int
	caFile string
	caPEM  string
	ln     net.Listener
}

// startUpstream answers with the host and path it saw and whether the
// Authorization header carried the expected secret (never echoing the
// secret itself back into the sandbox).
func startUpstream(t *testing.T, wantAuth string) *upstream {
	return startUpstreamWith(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch {
		case auth == "":
			auth = "none"
		case auth == wantAuth:
			auth = "valid"
		default:
			auth = "invalid:" + auth
		}
		fmt.Fprintf(w, "host=%s path=%s auth=%s\n", r.Host, r.URL.Path, auth)
	}))
}

// startUpstreamWith serves h on a loopback HTTPS listener whose
// certificate (allowed.test, other.test) its own CA signs.
func startUpstreamWith(t *testing.T, h http.Handler) *upstream {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames: []string{"allowed.test", "other.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, _ := x509.CreateCertificate(rand.Reader, leafTpl, ca, &key.PublicKey, caKey)
	cert := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	os.WriteFile(caFile, caPEM, 0o644)
	return &upstream{port: ln.Addr().(*net.TCPAddr).Port, caFile: caFile, caPEM: string(caPEM), ln: ln}
}

func TestEgress(t *testing.T) {
	const value = "s3cr3t-VALUE-never-inside"
	up := startUpstream(t, "Bearer "+value)
	s := startServer(t, "", "--egress-hosts", "allowed.test=127.0.0.1,other.test=127.0.0.1",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-root-ca", up.caFile, "--pool-size", "-1")
	var sec map[string]any
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "GITHUB_TOKEN", "value": value, "hosts": []string{fmt.Sprintf("allowed.test:%d", up.port)}, // a secret goes only to the ports it names
		"inject": map[string]string{"header": "Authorization", "format": "Bearer {value}"},
	}, &sec); code != 201 {
		t.Fatalf("put secret: %d %v", code, sec)
	}
	var list struct{ Secrets []map[string]any }
	s.do("GET", "/v1/secrets", s.key, nil, &list)
	if b, _ := jsonString(list); strings.Contains(b, value) || len(list.Secrets) != 1 {
		t.Fatalf("secret list leaks or is wrong: %s", b)
	}
	allowed := fmt.Sprintf("allowed.test:%d", up.port)
	other := fmt.Sprintf("other.test:%d", up.port)
	id := s.create(map[string]any{"network": map[string]any{"allow": []string{allowed}}, "secrets": []string{"GITHUB_TOKEN"}})

	// The sandbox holds a placeholder, never the value.
	ph := strings.TrimSpace(s.sh(id, "echo $GITHUB_TOKEN").Stdout)
	if !strings.HasPrefix(ph, "space_ph_") {
		t.Fatalf("GITHUB_TOKEN inside = %q", ph)
	}
	// curl through the proxy: the upstream sees the real value.
	r := s.sh(id, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://%s/user`, allowed))
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "auth=valid") {
		t.Fatalf("curl to the bound host: %+v", r)
	}
	// Python requests works too.
	r = s.sh(id, fmt.Sprintf(`python3 -c "import urllib.request,os; print(urllib.request.urlopen('https://%s/py').read().decode())"`, allowed))
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "path=/py") {
		t.Errorf("python through the proxy: %+v", r)
	}
	// A destination outside the policy is refused, with a clear reason.
	r = s.sh(id, fmt.Sprintf(`curl -sS https://%s/ 2>&1; echo rc=$?`, other))
	if !strings.Contains(r.Stdout, "rc=56") && !strings.Contains(r.Stdout, "403") {
		t.Errorf("disallowed host: %+v", r)
	}
	// Without the proxy there is no route at all.
	r = s.sh(id, fmt.Sprintf(`curl -sS --noproxy '*' --max-time 5 https://%s/ 2>&1; echo rc=$?`, allowed))
	if strings.Contains(r.Stdout, "host=") {
		t.Errorf("direct connection bypassed the proxy: %+v", r)
	}
	// A placeholder sent to another (allowed) host is refused, not swapped.
	var ns map[string]any
	if code := s.do("PUT", "/v1/sandboxes/"+id+"/network", s.key, map[string]any{"allow": []string{allowed, other}}, &ns); code != 200 {
		t.Fatalf("set network: %d %v", code, ns)
	}
	r = s.sh(id, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://%s/steal 2>&1; echo rc=$?`, other))
	if strings.Contains(r.Stdout, value) || strings.Contains(r.Stdout, "path=/steal") {
		t.Errorf("placeholder to an unbound host got through: %+v", r)
	}
	// The policy change took effect for new connections: other.test now
	// works without the placeholder.
	if r := s.sh(id, fmt.Sprintf(`curl -sS https://%s/now-ok`, other)); !strings.Contains(r.Stdout, "path=/now-ok") {
		t.Errorf("after allowing other.test: %+v", r)
	}
	s.do("PUT", "/v1/sandboxes/"+id+"/network", s.key, map[string]any{"allow": []string{allowed}, "deny": []string{"other.test"}}, &ns)
	if r := s.sh(id, fmt.Sprintf(`curl -sS https://%s/again 2>&1`, other)); strings.Contains(r.Stdout, "path=/again") {
		t.Errorf("after denying other.test: %+v", r)
	}
	// The audit log has allowed and refused attempts, with the secret's name.
	var log struct {
		Records []struct {
			Host     string `json:"host"`
			Decision string `json:"decision"`
			Reason   string `json:"reason"`
			Secret   string `json:"secret"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+id+"/egress", s.key, nil, &log)
	var allow, deny, leak, usedSecret bool
	for _, rec := range log.Records {
		allow = allow || rec.Decision == "allow"
		deny = deny || rec.Decision == "deny"
		leak = leak || strings.Contains(rec.Reason, "placeholder")
		usedSecret = usedSecret || rec.Secret == "GITHUB_TOKEN"
	}
	if !allow || !deny || !leak || !usedSecret {
		t.Errorf("audit log: allow %v deny %v leak %v secret %v: %+v", allow, deny, leak, usedSecret, log.Records)
	}
	if b, _ := jsonString(log); strings.Contains(b, value) {
		t.Errorf("audit log contains the secret value")
	}

	// No secret value in the sandbox's memory image, writable layer or
	// environment.
	runsc, root := runscPath(t), filepath.Join(s.data, "runsc")
	img := t.TempDir()
	if out, err := exec.Command(runsc, "--root", root, "checkpoint", "--leave-running", "--image-path", img, id).CombinedOutput(); err != nil {
		t.Fatalf("checkpoint: %v: %s", err, out)
	}
	upper := filepath.Join(t.TempDir(), "upper.tar")
	if out, err := exec.Command(runsc, "--root", root, "tar", "rootfs-upper", "--file", upper, id).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	for _, dir := range []string{img, filepath.Dir(upper)} {
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				b, _ := os.ReadFile(p)
				if bytes.Contains(b, []byte(value)) {
					t.Errorf("secret value found in %s", p)
				}
			}
			return nil
		})
	}
	if r := s.sh(id, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c "+value+" || true"); strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("secret value in a process environment: %q", r.Stdout)
	}

	// Default: a sandbox created without a policy has no way out at all.
	plain := s.create(nil)
	if r := s.sh(plain, fmt.Sprintf(`curl -sS --max-time 5 https://%s/ 2>&1; echo rc=$?; curl -sS --max-time 2 http://127.0.0.1:3128/ 2>&1; echo rc=$?`, allowed)); strings.Contains(r.Stdout, "host=") || strings.Count(r.Stdout, "rc=0") > 0 {
		t.Errorf("sandbox without a policy reached out: %+v", r)
	}
	// A fork child gets its own placeholder.
	var fk struct{ Sandboxes []sandboxView }
	s.do("POST", "/v1/sandboxes/"+id+"/fork", s.key, map[string]int{"count": 1}, &fk)
	if len(fk.Sandboxes) == 1 {
		kid := fk.Sandboxes[0].ID
		kph := strings.TrimSpace(s.sh(kid, "bash -lc 'echo $GITHUB_TOKEN'").Stdout)
		if kph == ph || !strings.HasPrefix(kph, "space_ph_") {
			t.Errorf("fork child's placeholder %q (parent %q)", kph, ph)
		}
		if r := s.sh(kid, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://%s/kid`, allowed)); !strings.Contains(r.Stdout, "auth=valid") {
			t.Errorf("fork child with its own placeholder: %+v", r)
		}
	} else {
		t.Errorf("fork: %+v", fk)
	}

	// A deleted secret (a leaked token) is no longer injected into a
	// running sandbox's requests: the proxy kept the value until the
	// sandbox ended. Put back with a new value, it injects that one.
	if code := s.do("DELETE", "/v1/secrets/GITHUB_TOKEN", s.key, nil, nil); code != 204 {
		t.Fatalf("delete secret: %d", code)
	}
	authed := fmt.Sprintf(`curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://%s/after-delete 2>&1`, allowed)
	if r := s.sh(id, authed); strings.Contains(r.Stdout, "auth=valid") || strings.Contains(r.Stdout, value) {
		t.Errorf("a deleted secret was still injected: %+v", r)
	}
	const rotated = "r0tated-VALUE-never-inside"
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "GITHUB_TOKEN", "value": rotated, "hosts": []string{fmt.Sprintf("allowed.test:%d", up.port)}, // a secret goes only to the ports it names
		"inject": map[string]string{"header": "Authorization", "format": "Bearer {value}"},
	}, nil); code != 201 {
		t.Fatalf("put the secret back: %d", code)
	}
	// The upstream echoes what it got (not the first value: "invalid"),
	// and the echo comes back with the value scrubbed to the placeholder.
	if r := s.sh(id, authed); !strings.Contains(r.Stdout, "auth=invalid:Bearer "+ph) || strings.Contains(r.Stdout, rotated) {
		t.Errorf("the rotated value was not injected (or not scrubbed): %+v", r)
	}
}

func runscPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("SPACE_RUNSC")
	if p == "" {
		matches, _ := filepath.Glob("/var/cache/space/runsc-*/runsc")
		if len(matches) == 0 {
			t.Fatal("runsc not found")
		}
		p = matches[0]
	}
	return p
}

// TestEgressWarmClaim: a create with a network policy and a secret is
// served from the warm pool like any other (answered before the identity
// reaches the agent); its first command already has the proxy env and a
// placeholder, its traffic goes through the proxy with the secret swapped
// in on the way to the bound host only, and the next warm sandbox, claimed
// without a policy, has no network at all.
func TestEgressWarmClaim(t *testing.T) {
	const value = "warm-s3cr3t-never-inside"
	up := startUpstream(t, "Bearer "+value)
	s := startServer(t, "", "--egress-hosts", "allowed.test=127.0.0.1,other.test=127.0.0.1",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-root-ca", up.caFile, "--pool-size", "1")
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "API_TOKEN", "value": value, "hosts": []string{fmt.Sprintf("allowed.test:%d", up.port)}, // a secret goes only to the ports it names
		"inject": map[string]string{"header": "Authorization", "format": "Bearer {value}"},
	}, nil); code != 201 {
		t.Fatalf("put secret: %d", code)
	}
	allowed := fmt.Sprintf("allowed.test:%d", up.port)
	other := fmt.Sprintf("other.test:%d", up.port)
	waitFor(t, "the pool to fill", 90*time.Second, func() bool { return poolReady(t, s, "base") == 1 })
	id := s.create(map[string]any{"network": map[string]any{"allow": []string{allowed}}, "secrets": []string{"API_TOKEN"}})
	waitFor(t, "the claim in the log", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=`+id+" ")
	})
	r := s.sh(id, fmt.Sprintf(`echo "[$API_TOKEN] [$HTTPS_PROXY]"; curl -sS -H "Authorization: Bearer $API_TOKEN" https://%s/warm`, allowed))
	if !strings.Contains(r.Stdout, "[space_ph_") || !strings.Contains(r.Stdout, "[http://127.0.0.1:3128]") || !strings.Contains(r.Stdout, "auth=valid") || strings.Contains(r.Stdout, value) {
		t.Errorf("first command in a warm sandbox with a policy and a secret: %+v", r)
	}
	if r := s.sh(id, fmt.Sprintf(`curl -sS https://%s/x 2>&1; echo rc=$?`, other)); strings.Contains(r.Stdout, "host=") {
		t.Errorf("a host outside the warm sandbox's policy was reached: %+v", r)
	}
	waitFor(t, "the pool to refill", 90*time.Second, func() bool { return poolReady(t, s, "base") == 1 })
	plain := s.create(nil)
	waitFor(t, "the second claim in the log", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=`+plain+" ")
	})
	if r := s.sh(plain, fmt.Sprintf(`echo "[$HTTPS_PROXY]"; curl -sS --max-time 5 https://%s/ 2>&1; echo rc=$?`, allowed)); !strings.Contains(r.Stdout, "[]") || strings.Contains(r.Stdout, "host=") {
		t.Errorf("a warm sandbox claimed without a policy has network: %+v", r)
	}

	// A sandbox with a policy made from a files snapshot of one without:
	// the snapshot's trust store (without this sandbox's CA) and its
	// missing Node preload are not restored over what the agent set up
	// (curl failed on the proxy's certificate, node did not start).
	snap := s.snapshot(plain, "files", "")
	fromSnap := s.create(map[string]any{"snapshot": snap.ID, "network": map[string]any{"allow": []string{allowed}}, "secrets": []string{"API_TOKEN"}})
	if r := s.sh(fromSnap, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $API_TOKEN" https://%s/restored && node -e 'console.log("node ok")'`, allowed)); r.ExitCode != 0 || !strings.Contains(r.Stdout, "auth=valid") || !strings.Contains(r.Stdout, "node ok") {
		t.Errorf("egress in a sandbox made from a files snapshot: %+v", r)
	}
	// A destroyed sandbox's interception CA goes with it (every sandbox
	// ever created kept one, in memory and on disk).
	caFile := filepath.Join(s.data, "egress", "ca", fromSnap+".ca.json")
	if _, err := os.Stat(caFile); err != nil {
		t.Errorf("the CA of a running sandbox with egress: %v", err)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+fromSnap, s.key, nil, nil); code != 204 {
		t.Fatalf("kill: %d", code)
	}
	if _, err := os.Stat(caFile); !os.IsNotExist(err) {
		t.Errorf("the CA of a destroyed sandbox is still stored: %v", err)
	}
}
