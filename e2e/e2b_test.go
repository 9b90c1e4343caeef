package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/e2b/gen/process"
	"github.com/spacesandbox/space/internal/e2b/gen/process/processconnect"
)

// TestE2BSDK runs the unmodified E2B JS SDKs (e2e/e2b: e2b@2.51.0, e2b@2.50.0
// for the old paths) against a real `space serve --e2b-listen` with real
// sandboxes. It installs the pinned npm packages first when node_modules is
// missing (npm ci from the committed lockfile).
func TestE2BSDK(t *testing.T) {
	node, dir, s, addr := e2bServer(t)
	teamKey := s.teamKey("e2b-sdk")
	otherKey := s.teamKey("e2b-other")

	// SPACE_E2B_TESTS (a glob, e.g. "parity.test.mjs") runs some files
	// only, without waiting for (or requiring a claim from) the pool.
	subset := os.Getenv("SPACE_E2B_TESTS")
	pattern := cmp.Or(subset, "*.test.mjs")
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	if len(files) == 0 {
		t.Fatalf("no e2e/e2b/%s", pattern)
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
	// The suite starts with the python-data pool full: code-interpreter
	// sandboxes are claimed warm (their identity, env and all, delivered
	// at the claim) as well as created cold once the pool is empty.
	if subset == "" {
		waitFor(t, "the python-data pool to fill", 3*time.Minute, func() bool { return poolReady(t, s, "python-data") == 1 })
	}
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Logf("server log:\n%s", tail(s.logText(), 20000))
		t.Fatalf("E2B SDK suite failed: %v", err)
	}
	if subset == "" && !regexp.MustCompile(`sandbox created from the warm pool" sandbox=\S+ template=python-data`).MatchString(s.logText()) {
		t.Errorf("no code-interpreter sandbox of the suite was claimed from the python-data pool")
	}
}

// e2bServer finds node, installs the pinned SDKs into e2b/ and starts a
// server with the E2B facade on addr and the python-data template built.
func e2bServer(t *testing.T) (node, dir string, s *server, addr string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real sandboxes and Node")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found on PATH (Node >= 20.18.1 runs the E2B SDK suite): %v", err)
	}
	if dir, err = filepath.Abs("e2b"); err != nil {
		t.Fatal(err)
	}
	npmInstall(t, dir)
	addr = freeAddr(t)
	// code-interpreter-v1 maps to space's python-data template (matplotlib):
	// built once into the shared cache, a cache hit afterwards. A pool of
	// it starts with the build, so the SDKs' code-interpreter sandboxes are
	// claimed warm (identity, env and all) as well as created cold.
	s = startServer(t, "", "--e2b-listen", addr, "--snapshot-interval", "-1", "--pools", "python-data=1")
	s.buildTemplate("python-data")
	return node, dir, s, addr
}

// npmInstall installs e2e/e2b's pinned packages unless they are there.
func npmInstall(t *testing.T, dir string) {
	t.Helper()
	npmInstallFor(t, dir, "e2b")
}

// npmInstallFor installs dir's pinned packages (npm ci from its lockfile)
// unless package pkg is already in its node_modules.
func npmInstallFor(t *testing.T, dir, pkg string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err == nil {
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

// TestE2BAcrossRestart: what the E2B facade keeps for a sandbox outlives
// the server. The unmodified SDK creates code contexts with state, the
// server restarts, and the same contexts (and the default one) answer with
// their state, also in a fork's child (e2b/restart.mjs); a process started
// with a tag through envd's process API is found by its tag afterwards.
func TestE2BAcrossRestart(t *testing.T) {
	node, dir, s, addr := e2bServer(t)
	key := s.teamKey("e2b-restart")
	url := "http://" + addr
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	runNode := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, node, append([]string{"restart.mjs"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "NO_COLOR=1", "E2B_DEBUG=")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node restart.mjs %s: %v\n%s%s", args[0], err, out, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}

	before := runNode("before")
	var made struct{ ID string }
	if err := json.Unmarshal([]byte(before), &made); err != nil || made.ID == "" {
		t.Fatalf("before: %q: %v", before, err)
	}

	// envd's process API, as the SDKs speak it (Connect), with a tag.
	procs := func() processconnect.ProcessClient {
		token := e2bAccessToken(t, url, key, made.ID)
		return processconnect.NewProcessClient(http.DefaultClient, url, connect.WithInterceptors(connect.UnaryInterceptorFunc(
			func(next connect.UnaryFunc) connect.UnaryFunc {
				return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
					r.Header().Set("E2b-Sandbox-Id", made.ID)
					r.Header().Set("X-Access-Token", token)
					return next(ctx, r)
				}
			})))
	}
	streamHeaders := func(r *connect.Request[process.StartRequest]) {
		r.Header().Set("E2b-Sandbox-Id", made.ID)
		r.Header().Set("X-Access-Token", e2bAccessToken(t, url, key, made.ID))
	}
	start := func(tag string) (*connect.ServerStreamForClient[process.StartResponse], error) {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"600"}}, Tag: &tag})
		streamHeaders(req)
		return procs().Start(ctx, req)
	}
	st, err := start("worker")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("start: no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	st.Close()
	reserved, err := start("space.e2b-context:{}")
	if err == nil {
		if reserved.Receive() {
			err = errors.New("started")
		} else {
			err = reserved.Err()
		}
		reserved.Close()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a reserved tag: %v, want invalid_argument", err)
	}

	// A procedure space does not serve answers a Connect error in JSON
	// (connect's own handler answered a text 404).
	req, _ := http.NewRequest("POST", url+"/filesystem.Filesystem/Nope", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", made.ID)
	req.Header.Set("X-Access-Token", e2bAccessToken(t, url, key, made.ID))
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		var e struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 501 || e.Code != "unimplemented" {
			t.Errorf("unknown procedure: %d %+v", resp.StatusCode, e)
		}
	}

	s.stop(false)
	s.start()

	c := procs()
	list, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var tagged uint32
	for _, p := range list.Msg.GetProcesses() {
		if p.GetTag() == "worker" {
			tagged = p.GetPid()
		}
	}
	if tagged != pid {
		t.Errorf("after the restart the process tagged worker is pid %d, want %d (list %v)", tagged, pid, list.Msg.GetProcesses())
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "worker"}}, Signal: process.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Errorf("signal by tag after the restart: %v", err)
	}
	waitFor(t, "the tagged process to end", 10*time.Second, func() bool {
		l, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			return false
		}
		for _, p := range l.Msg.GetProcesses() {
			if p.GetPid() == pid {
				return false
			}
		}
		return true
	})

	runNode("after", before)
}

// e2bAccessToken is a sandbox's envd access token, from the E2B connect call.
func e2bAccessToken(t *testing.T, url, key, id string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/sandboxes/"+id+"/connect", strings.NewReader(`{"timeout":600}`))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Token string `json:"envdAccessToken"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Token == "" {
		t.Fatalf("connect %s: %d %v", id, resp.StatusCode, err)
	}
	return v.Token
}

// e2bSandbox is what an E2B create answers.
type e2bSandbox struct {
	ID      string `json:"sandboxID"`
	Token   string `json:"envdAccessToken"`
	Traffic string `json:"trafficAccessToken"`
}

// e2bCreate creates a base sandbox through the E2B control plane at url,
// destroyed when t ends.
func e2bCreate(t *testing.T, url, key string) e2bSandbox {
	t.Helper()
	return e2bCreateWith(t, url, key, `{"templateID":"base"}`)
}

// e2bCreateWith is e2bCreate with the create body given.
func e2bCreateWith(t *testing.T, url, key, body string) e2bSandbox {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/sandboxes", strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var made e2bSandbox
	json.NewDecoder(resp.Body).Decode(&made)
	resp.Body.Close()
	if made.ID == "" || made.Token == "" || made.Traffic == "" {
		t.Fatalf("create: %d %+v", resp.StatusCode, made)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", url+"/sandboxes/"+made.ID, nil)
		req.Header.Set("X-API-Key", key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return made
}

// TestE2BSignedUpload: a signed upload URL (uploadUrl) writes its one path.
// A multipart body with a second part used to write wherever that part's
// filename said (/etc included).
func TestE2BSignedUpload(t *testing.T) {
	_, _, s, addr := e2bServer(t)
	key := s.teamKey("e2b-signed")
	url := "http://" + addr
	made := e2bCreate(t, url, key)
	token := made.Token
	const target = "/home/user/up.txt"
	sum := sha256.Sum256([]byte(target + ":write::" + token))
	signed := url + "/files?path=" + target + "&signature=" + neturl.QueryEscape("v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	upload := func(names ...string) int {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, n := range names {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, n))
			pw, _ := mw.CreatePart(h)
			pw.Write([]byte("from " + n))
		}
		mw.Close()
		req, _ := http.NewRequest("POST", signed, &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.Header.Set("E2b-Sandbox-Id", made.ID)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := upload(target, "/etc/evil-from-signed-url"); code != 400 {
		t.Errorf("a signed upload with a second part: %d, want 400", code)
	}
	read := func(p string) (int, string) {
		return httpGet(t, url+"/files?path="+p, "", http.Header{"E2b-Sandbox-Id": {made.ID}, "X-Access-Token": {token}})
	}
	if code, body := read("/etc/evil-from-signed-url"); code != 404 {
		t.Errorf("the second part was written: %d %q", code, body)
	}
	if code := upload(target); code != 200 {
		t.Errorf("a signed upload of its one file: %d", code)
	}
	if code, body := read(target); code != 200 || body != "from "+target {
		t.Errorf("the signed file: %d %q", code, body)
	}
}

// TestE2BPorts: what sandbox.getHost(port) names, "<port>-<id>.<domain>",
// reaches a server in the sandbox through the E2B listener with the
// sandbox's traffic access token, and nothing without it; the token is not
// passed on.
func TestE2BPorts(t *testing.T) {
	_, _, s, addr := e2bServer(t)
	key := s.teamKey("e2b-ports")
	url := "http://" + addr
	made := e2bCreate(t, url, key)
	startPortServer(t, s, key, "sb-"+made.ID, 8000)
	get := func(path, host, token string) (int, string) {
		t.Helper()
		return httpGet(t, url+path, host, http.Header{"E2b-Traffic-Access-Token": {token}})
	}
	host := "8000-" + made.ID + ".space.test"
	if code, body := get("/x%2Fz?y=1", host, made.Traffic); code != 200 || body != "path=/x%2Fz?y=1" {
		t.Errorf("escaped path through the E2B port proxy: %d %q", code, body)
	}
	if code, body := get("/x?y=1", host, made.Traffic); code != 200 || body != "path=/x?y=1" {
		t.Errorf("getHost(8000): %d %q", code, body)
	}
	if code, body := get("/headers", host, made.Traffic); code != 200 || strings.Contains(strings.ToLower(body), "traffic-access-token") || !strings.Contains(body, host) {
		t.Errorf("headers the sandbox saw: %d %s", code, body)
	}
	// E2B's credentials have headers of their own: the app's Authorization
	// reaches it, the tokens and an E2B API key do not.
	if code, body := httpGet(t, url+"/headers", host, http.Header{"E2b-Traffic-Access-Token": {made.Traffic}, "X-Api-Key": {key}, "Authorization": {"Bearer app-token"}}); code != 200 ||
		!strings.Contains(body, `"Authorization": "Bearer app-token"`) || strings.Contains(body, key) || strings.Contains(body, made.Traffic) {
		t.Errorf("headers the sandbox saw with the app's Authorization: %d %s", code, body)
	}
	if code, _ := get("/x", host, ""); code != 401 {
		t.Errorf("no token: %d", code)
	}
	// Another sandbox's token (another team's, here) opens nothing here.
	other := e2bCreate(t, url, s.teamKey("e2b-ports-other"))
	if code, _ := get("/x", host, other.Traffic); code != 401 {
		t.Errorf("another sandbox's traffic token: %d", code)
	}
	if code, _ := httpGet(t, url+"/x", host, http.Header{"X-Access-Token": {other.Token}}); code != 401 {
		t.Errorf("another sandbox's envd token: %d", code)
	}
	// allowPublicTraffic: true (only an explicit true) opens a sandbox's
	// ports without a token; the space API still needs its key.
	pub := e2bCreateWith(t, url, key, `{"templateID":"base","network":{"allowPublicTraffic":true}}`)
	startPortServer(t, s, key, "sb-"+pub.ID, 8000)
	if code, body := get("/open", "8000-"+pub.ID+".space.test", ""); code != 200 || body != "path=/open" {
		t.Errorf("a public sandbox's port without a token: %d %q", code, body)
	}
	var view struct {
		PublicPorts bool `json:"public_ports"`
	}
	if s.do("GET", "/v1/sandboxes/sb-"+pub.ID, key, nil, &view); !view.PublicPorts {
		t.Errorf("the sandbox's view does not say its ports are public")
	}
	if code, _ := httpGet(t, s.url+"/v1/sandboxes/sb-"+pub.ID+"/ports/8000/open", "", nil); code != 401 {
		t.Errorf("the /v1 port path without a key, public sandbox: %d", code)
	}
	if code, body := get("/x", "8001-"+made.ID+".space.test", made.Traffic); code != 502 || !strings.Contains(body, "nothing listens") {
		t.Errorf("closed port: %d %s", code, body)
	}
}

// TestE2BInterpreterPrestarted: with the E2B facade on, a python-data
// pool's sandboxes wait with the code interpreter's default kernel
// running and its data libraries imported. A code-interpreter sandbox
// claimed from it runs its first cell in that kernel, which took the
// owner's envVars at the claim.
func TestE2BInterpreterPrestarted(t *testing.T) {
	_, _, s, addr := e2bServer(t)
	key := s.teamKey("e2b-prestart")
	url := "http://" + addr
	waitFor(t, "the python-data pool to fill", 90*time.Second, func() bool { return poolReady(t, s, "python-data") == 1 })
	var pools struct {
		Pools []struct {
			Template string
			Prestart []string
		}
	}
	if code := s.do("GET", "/v1/pools", s.key, nil, &pools); code != 200 || len(pools.Pools) != 2 ||
		pools.Pools[0].Template != "base" || pools.Pools[0].Prestart != nil ||
		pools.Pools[1].Template != "python-data" || !slices.Contains(pools.Pools[1].Prestart, "--preload") {
		t.Errorf("GET /v1/pools: %d %+v, want base without a prestart and python-data with the kernel", code, pools)
	}
	made := e2bCreateWith(t, url, key, `{"templateID":"code-interpreter-v1","envVars":{"OWNER_VAR":"mine"}}`)
	waitFor(t, "the claim in the log", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=sb-`+made.ID+" template=python-data")
	})
	code := "import os, sys\n(os.environ.get('OWNER_VAR'), 'pandas' in sys.modules, 'matplotlib.pyplot' in sys.modules)"
	body, _ := json.Marshal(map[string]string{"code": code})
	// execute sends the cell to a sandbox's /execute as the SDK does.
	execute := func(id, token string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/execute", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		req.Header.Set("X-Access-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	status, out := execute(made.ID, made.Token)
	var result string
	for line := range strings.Lines(string(out)) {
		var m struct {
			Type string `json:"type"`
			Text string `json:"text"`
			Main bool   `json:"is_main_result"`
		}
		if json.Unmarshal([]byte(line), &m) != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		switch {
		case m.Type == "result" && m.Main:
			result = m.Text
		case m.Type == "ready" || m.Type == "error":
			t.Errorf("execute answered %s", line)
		}
	}
	if want := "('mine', True, True)"; status != 200 || result != want {
		t.Fatalf("first cell: %d result %q, want %q (the prestarted kernel, with the owner's env and its imports)\n%s", status, result, want, out)
	}

	// A create through space's own API does not keep the kernel: the
	// claimed sandbox runs nothing, and holds on disk what a cold sandbox
	// of its template holds (the kernel's script went with the kernel,
	// and matplotlib's font list is the template's).
	waitFor(t, "the python-data pool to refill with a kernel", 90*time.Second, func() bool { return poolReady(t, s, "python-data") == 1 })
	listing := "find /tmp /home/user /root | sort"
	native := s.create(map[string]any{"template": "python-data"})
	waitFor(t, "the native create's claim in the log", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=`+native+" template=python-data")
	})
	cold := s.create(map[string]any{"template": "python-data", "memory_mb": 640}) // not the pool's shape
	if got, want := s.sh(native, listing), s.sh(cold, listing); got.ExitCode != 0 || got.Stdout != want.Stdout || strings.Contains(got.Stdout, ".space-e2b") {
		t.Errorf("files of a sandbox claimed without its prestarted kernel:\n%s\nwant those of a cold one:\n%s", got.Stdout, want.Stdout)
	}
	if ps := s.processes(native); len(ps) != 1 || ps[0].Running {
		t.Errorf("processes in a sandbox claimed without its prestarted kernel: %+v, want only the listing, exited", ps)
	}

	// An admin turns the prestart off: the pool is made again without
	// the kernel, and a first cell starts its own (nothing imported yet).
	var set struct {
		Prestart *bool
		State    string
	}
	if code := s.do("PUT", "/v1/pools/python-data", s.key, map[string]any{"size": 1, "prestart": false}, &set); code != 200 || set.Prestart == nil || *set.Prestart || set.State != "running" {
		t.Fatalf("PUT prestart false: %d %+v", code, set)
	}
	waitFor(t, "the python-data pool to be made again without the kernel", 90*time.Second, func() bool {
		var now struct {
			Pools []struct {
				Template string
				Ready    int
				Prestart []string
			}
		}
		s.do("GET", "/v1/pools", s.key, nil, &now)
		for _, p := range now.Pools {
			if p.Template == "python-data" {
				return p.Prestart == nil && p.Ready == 1
			}
		}
		return false
	})
	plain := e2bCreateWith(t, url, key, `{"templateID":"code-interpreter-v1","envVars":{"OWNER_VAR":"mine"}}`)
	waitFor(t, "the claim in the log", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=sb-`+plain.ID+" template=python-data")
	})
	var procs struct{ Processes []struct{ Cmd []string } }
	if code := s.do("GET", "/v1/sandboxes/sb-"+plain.ID+"/processes", key, nil, &procs); code != 200 || len(procs.Processes) != 0 {
		t.Errorf("a sandbox of the pool without prestart runs processes: %d %+v", code, procs)
	}
	status, out = execute(plain.ID, plain.Token)
	if want := `"text": "('mine', False, False)"`; status != 200 || !strings.Contains(string(out), want) {
		t.Errorf("first cell without a prestarted kernel: %d %s, want %s", status, out, want)
	}
}
