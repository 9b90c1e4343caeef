package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2BSDK runs the unmodified E2B JS SDKs (e2e/e2b: e2b@2.51.0, e2b@2.50.0
// for the old paths) against a real `space serve --e2b-listen` with real
// sandboxes. It installs the pinned npm packages first when node_modules is
// missing (npm ci from the committed lockfile).
func TestE2BSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes and Node")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found on PATH (Node >= 20.18.1 runs the E2B SDK suite): %v", err)
	}
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	npmInstall(t, dir)

	addr := freeAddr(t)
	s := startServer(t, "", "--e2b-listen", addr, "--snapshot-interval", "-1")
	// code-interpreter-v1 maps to space's python-data template (matplotlib):
	// built once into the shared cache, a cache hit afterwards.
	s.buildTemplate("python-data")
	teamKey := s.teamKey("e2b-sdk")
	otherKey := s.teamKey("e2b-other")

	files, _ := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if len(files) == 0 {
		t.Fatal("no e2e/e2b/*.test.mjs")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	args := append([]string{"--test", "--test-concurrency=4", "--test-reporter=spec"}, files...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = dir
	url := "http://" + addr
	cmd.Env = append(os.Environ(),
		"E2B_API_KEY="+teamKey, "E2B_OTHER_API_KEY="+otherKey,
		"E2B_API_URL="+url, "E2B_SANDBOX_URL="+url,
		"E2B_RUN_ID="+strings.ReplaceAll(filepath.Base(t.TempDir()), "_", "-"),
		"NO_COLOR=1", "E2B_DEBUG=",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("E2B SDK suite failed: %v", err)
	}
}

// npmInstall installs e2e/e2b's pinned packages unless they are there.
func npmInstall(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err == nil {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm not found on PATH: %v", err)
	}
	verb := "install"
	if _, err := os.Stat(filepath.Join(dir, "package-lock.json")); err == nil {
		verb = "ci"
	}
	cmd := exec.Command(npm, verb, "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm %s in %s: %v\n%s", verb, dir, err, out)
	}
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// buildTemplate builds (or finds in the cache) a built-in template.
func (s *server) buildTemplate(name string) {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/v1/templates/"+name+"/build", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("build template %s: %v", name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "event: done") {
		s.t.Fatalf("build template %s: %d %s", name, resp.StatusCode, tail(string(body), 2000))
	}
}

// teamKey makes an API key of team with the admin key.
func (s *server) teamKey(team string) string {
	s.t.Helper()
	var k struct {
		Key string `json:"key"`
	}
	if code := s.do("POST", "/v1/keys", s.key, map[string]string{"team": team, "name": "e2b test"}, &k); code != 201 || k.Key == "" {
		s.t.Fatalf("create key for team %s: %d", team, code)
	}
	return k.Key
}
