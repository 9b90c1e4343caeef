package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/agentproto"
)

func TestRoute(t *testing.T) {
	for _, tc := range []struct {
		host, id, port string
		wantID         string
		wantPort       int
		ok             bool
	}{
		{host: "127.0.0.1:3000", id: "abc", port: "49983", wantID: "sb-abc", wantPort: 49983, ok: true},
		{host: "127.0.0.1:3000", id: "abc", port: "49999", wantID: "sb-abc", wantPort: 49999, ok: true},
		{host: "127.0.0.1:3000", id: "abc", wantID: "sb-abc", wantPort: 49983, ok: true},
		{host: "49983-xyz234.sandbox.example.com", wantID: "sb-xyz234", wantPort: 49983, ok: true},
		{host: "8080-xyz.example.com:443", wantID: "sb-xyz", wantPort: 8080, ok: true},
		{host: "api.example.com"},
		{host: "127.0.0.1:3000"},
		{host: "localhost"},
	} {
		r := httptest.NewRequest("GET", "http://"+tc.host+"/health", nil)
		r.Host = tc.host
		if tc.id != "" {
			r.Header.Set("E2b-Sandbox-Id", tc.id)
		}
		if tc.port != "" {
			r.Header.Set("E2b-Sandbox-Port", tc.port)
		}
		id, port, ok := route(r)
		if ok != tc.ok || id != tc.wantID || port != tc.wantPort {
			t.Errorf("route(%s, %q, %q) = %q %d %v, want %q %d %v", tc.host, tc.id, tc.port, id, port, ok, tc.wantID, tc.wantPort, tc.ok)
		}
	}
}

func TestIDs(t *testing.T) {
	if e2bID("sb-abc") != "abc" || spaceID("abc") != "sb-abc" || spaceID("sb-abc") != "sb-abc" {
		t.Fatal("id mapping")
	}
}

// The SDK encodes metadata three times: {a: "b c"} → metadata=a%3Db%252520c.
func TestListQueryMetadata(t *testing.T) {
	q, err := url.ParseQuery("metadata=a%3Db%252520c%26k%3Dv&state=running,paused&limit=5&order=desc")
	if err != nil {
		t.Fatal(err)
	}
	lq, err := parseListQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	if lq.metadata["a"] != "b c" || lq.metadata["k"] != "v" {
		t.Errorf("metadata = %v", lq.metadata)
	}
	if lq.limit != 5 || !lq.desc || len(lq.states) != 3 {
		t.Errorf("query = %+v", lq)
	}
	if _, err := parseListQuery(url.Values{"state": {"stopped"}}); err == nil {
		t.Error("state=stopped accepted")
	}
}

func TestSignature(t *testing.T) {
	h := &Handler{tokenKey: []byte("k")}
	tok := "tok"
	sum := sha256.Sum256([]byte("/tmp/a.txt:read::" + tok))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	r := httptest.NewRequest("GET", "/files?path=/tmp/a.txt&signature="+url.QueryEscape(sig), nil)
	if !h.validSignature(r, tok) {
		t.Error("valid signature refused")
	}
	r = httptest.NewRequest("POST", "/files?path=/tmp/a.txt&signature="+url.QueryEscape(sig), nil)
	if h.validSignature(r, tok) {
		t.Error("read signature accepted for a write")
	}
	r = httptest.NewRequest("GET", "/files?path=/tmp/a.txt&signature_expiration=1&signature="+url.QueryEscape(sig), nil)
	if h.validSignature(r, tok) {
		t.Error("expired signature accepted")
	}
}

func TestEndEvent(t *testing.T) {
	one, zero := 1, 0
	if e := endEvent(agentproto.Event{ExitCode: &zero}); e.ExitCode != 0 || e.Error != nil || e.Status != "exit status 0" {
		t.Errorf("exit 0: %+v", e)
	}
	if e := endEvent(agentproto.Event{ExitCode: &one}); e.ExitCode != 1 || e.GetError() != "exit status 1" {
		t.Errorf("exit 1: %+v", e)
	}
	if e := endEvent(agentproto.Event{Signal: "SIGKILL"}); e.ExitCode != -1 || e.Status != "signal: killed" || e.Exited {
		t.Errorf("killed: %+v", e)
	}
}

func TestNetworkSpec(t *testing.T) {
	no := false
	if networkSpec(&no, nil, nil) != nil {
		t.Error("allow_internet_access:false gave a network")
	}
	if s := networkSpec(nil, nil, nil); s == nil || s.Allow[0] != "*" {
		t.Errorf("default = %+v, want internet", s)
	}
	if s := networkSpec(&no, []string{"example.com"}, []string{"bad.com"}); s == nil || s.Allow[0] != "example.com" || s.Deny[0] != "bad.com" {
		t.Errorf("allow list = %+v", s)
	}
	// ALL_TRAFFIC denied: nothing but allowOut (an allow list, not a deny
	// CIDR that would refuse the allowed hosts and miss IPv6).
	if s := networkSpec(nil, nil, []string{"0.0.0.0/0"}); s != nil {
		t.Errorf("denyOut [ALL_TRAFFIC] = %+v, want no network", s)
	}
	if s := networkSpec(nil, []string{"api.x.com"}, []string{"0.0.0.0/0", "::/0", "10.0.0.0/8"}); s == nil ||
		len(s.Allow) != 1 || s.Allow[0] != "api.x.com" || len(s.Deny) != 1 || s.Deny[0] != "10.0.0.0/8" {
		t.Errorf("allowOut with denyOut [ALL_TRAFFIC] = %+v, want the allow list", s)
	}
	if s := networkSpec(nil, nil, []string{"1.2.3.0/24"}); s == nil || s.Allow[0] != "*" || s.Deny[0] != "1.2.3.0/24" {
		t.Errorf("a deny list alone = %+v, want internet without it", s)
	}
}

// TestKernelTag: a kernel's tag names its context and is read back; other
// tags, and tags with a bad context, name none.
func TestKernelTag(t *testing.T) {
	c := &codeContext{ID: "0123abcd", Language: "javascript", Cwd: "/home/user/my dir"}
	got, ok := contextOfTag(kernelTag(c))
	if !ok || got.ID != c.ID || got.Language != c.Language || got.Cwd != c.Cwd {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	for _, tag := range []string{"", "worker", kernelTagPrefix, kernelTagPrefix + "{", kernelTagPrefix + `{"language":"python"}`,
		kernelTagPrefix + `{"id":"x","language":"cobol"}`, "x" + kernelTag(c)} {
		if c, ok := contextOfTag(tag); ok {
			t.Errorf("tag %q names context %+v", tag, c)
		}
	}
	if !strings.HasPrefix(kernelTag(c), reservedTagPrefix) {
		t.Error("kernel tags must be reserved")
	}
}

// TestRunningTagged: a tag selects the latest started running process.
func TestRunningTagged(t *testing.T) {
	t0 := time.Now()
	procs := []agentproto.Process{
		{PID: 1, Tag: "w", Running: true, StartedAt: t0},
		{PID: 2, Tag: "w", Running: true, StartedAt: t0.Add(time.Second)},
		{PID: 3, Tag: "w", Running: false, StartedAt: t0.Add(2 * time.Second)},
		{PID: 4, Tag: "other", Running: true, StartedAt: t0.Add(3 * time.Second)},
	}
	if p, ok := runningTagged(procs, "w"); !ok || p.PID != 2 {
		t.Errorf("w: %d %v, want 2", p.PID, ok)
	}
	if _, ok := runningTagged(procs, "gone"); ok {
		t.Error("a tag nobody has was found")
	}
	if _, ok := runningTagged(procs[2:3], "w"); ok {
		t.Error("an exited process was selected")
	}
}

// A create keeps a prestarted kernel only when the owner's env sets
// nothing a kernel reads at its start only.
func TestStartupEnv(t *testing.T) {
	for env, want := range map[string]bool{
		"":                     false,
		"OWNER_VAR":            false,
		"MPLBACKEND":           false,
		"HTTP_PROXY":           false,
		"PYTHONPATH":           true,
		"PYTHONHASHSEED":       true,
		"TZ":                   true,
		"LANG":                 true,
		"LC_ALL":               true,
		"LD_PRELOAD":           true,
		"OMP_NUM_THREADS":      true,
		"OPENBLAS_NUM_THREADS": true,
		"MPLCONFIGDIR":         true,
		"HOME":                 true,
		"TMPDIR":               true,
		"XDG_CACHE_HOME":       true,
		"NUMEXPR_MAX_THREADS":  true,
		"MKL_NUM_THREADS":      true,
	} {
		m := map[string]string{"A": "1"}
		if env != "" {
			m[env] = "x"
		}
		if got := startupEnv(m); got != want {
			t.Errorf("startupEnv with %s = %v, want %v", env, got, want)
		}
	}
}

// TestWatchersBounded: a sandbox has at most maxWatchers polling watchers
// (resource exhausted past them), a killed sandbox's go at once, and a
// watcher nobody polls goes after watcherIdle; each one removed has its
// watch cancelled. They stayed until RemoveWatcher, each with up to
// 10,000 events, whatever became of their sandbox or client.
func TestWatchersBounded(t *testing.T) {
	ws := newWatchers()
	cancelled := map[string]int{}
	now := time.Now()
	mk := func(sb string, at time.Time) (string, error) {
		return ws.add(&watcher{sandbox: sb, polled: at, cancel: func() { cancelled[sb]++ }})
	}
	for i := 0; i < maxWatchers; i++ {
		if _, err := mk("sb-a", now); err != nil {
			t.Fatalf("watcher %d: %v", i, err)
		}
	}
	if _, err := mk("sb-a", now); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("watcher %d of a sandbox: %v, want resource exhausted", maxWatchers+1, err)
	}
	if _, err := mk("sb-b", now); err != nil {
		t.Errorf("another sandbox's watcher: %v", err)
	}
	ws.forget("sb-a")
	if cancelled["sb-a"] != maxWatchers || len(ws.m) != 1 {
		t.Errorf("after the kill: %d cancelled, %d left; want %d and 1", cancelled["sb-a"], len(ws.m), maxWatchers)
	}
	later := now.Add(watcherIdle + time.Second)
	if _, err := mk("sb-c", later); err != nil { // sweeps sb-b's, idle since now
		t.Fatal(err)
	}
	if cancelled["sb-b"] != 1 || len(ws.m) != 1 {
		t.Errorf("an idle watcher: cancelled %d times, %d watchers left; want 1 and 1", cancelled["sb-b"], len(ws.m))
	}
}
