package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// cpuShares reads a gVisor sandbox's cgroup v1 CPU share ("" without
// cgroup v1).
func cpuShares(id string) string {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu/space", id, "cpu.shares"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func pooledCount(t *testing.T, s *server) int {
	return int(metric(t, s, `space_sandboxes{state="pooled"}`))
}

// TestWarmPool: creates are served from pre-started sandboxes that get
// their identity at claim time; a claimed sandbox is never handed out
// again and carries nothing of anyone else; the pool refills; a graceful
// shutdown destroys the warm sandboxes.
func TestWarmPool(t *testing.T) {
	s := startServer(t, "", "--pool-size", "2", "--snapshot-interval", "-1")
	waitFor(t, "the pool to fill", 60*time.Second, func() bool { return pooledCount(t, s) >= 2 })
	// Operators see how many are booted and ready, not only recorded.
	waitFor(t, "space_pool_ready to report the pool", 60*time.Second, func() bool {
		resp, err := http.Get(s.url + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return regexp.MustCompile(`space_pool_ready\{template="base"\} [12]`).Match(b)
	})
	// Warm sandboxes wait at the lowest CPU share, so refills never slow
	// the sandboxes in use; a claim restores the normal share.
	pooledIDs, _ := filepath.Glob(filepath.Join(s.data, "sandboxes", "sb-*"))
	for _, dir := range pooledIDs {
		if sh := cpuShares(filepath.Base(dir)); sh != "" && sh != "2" {
			t.Errorf("pooled sandbox %s: cpu.shares %s, want 2", filepath.Base(dir), sh)
		}
	}

	var a sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"env": map[string]string{"TENANT": "alpha"}, "metadata": map[string]string{"who": "alpha"}, "timeout_s": 120}, &a); code != 201 {
		t.Fatalf("create: %d", code)
	}
	if n := pooledCount(t, s); n > 1 {
		// The create took one; the refill may already be under way, but
		// not finished within this instant on a 2-core machine.
		t.Logf("pooled right after a claim: %d", n)
	}
	// The pool warmed it up before the claim (agent.handleWarmup): nothing
	// of that is left in the process list.
	var procs struct{ Processes []map[string]any }
	if code := s.do("GET", "/v1/sandboxes/"+a.ID+"/processes", s.key, nil, &procs); code != 200 || len(procs.Processes) != 0 {
		t.Errorf("claimed sandbox's processes: %d %v, want none", code, procs.Processes)
	}
	if r := s.sh(a.ID, "echo $TENANT; hostname; id -un"); r.Stdout != "alpha\nsandbox\nuser\n" {
		t.Errorf("claimed sandbox identity: %+v", r)
	}
	if sh := cpuShares(a.ID); sh != "" && sh != "1024" {
		t.Errorf("claimed sandbox: cpu.shares %s, want 1024", sh)
	}
	if a.Metadata["who"] != "alpha" || a.ExpiresAt.Sub(a.CreatedAt) != 120*time.Second || a.State != "running" {
		t.Errorf("claimed record: %+v", a)
	}
	// Its memory watch was registered while it waited in the pool (not
	// at the claim): a process past the sandbox's memory is killed, not
	// the sandbox.
	waitFor(t, a.ID+" to be logged as served from the pool", 10*time.Second, func() bool {
		return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=`+a.ID)
	})
	var oom execResult
	if code := s.do("POST", "/v1/sandboxes/"+a.ID+"/exec", s.key, map[string]any{"cmd": []string{"python3", "-c", "b'x' * (1 << 30)"}}, &oom); code != 200 || oom.ExitCode != 137 || oom.Error != "oom" {
		t.Fatalf("allocating past a claimed sandbox's memory: %d %+v, want killed with error oom", code, oom)
	}
	if r := s.sh(a.ID, "echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("claimed sandbox after the oom kill: %+v", r)
	}
	s.put(a.ID, "/home/user/alpha-secret.txt", strings.NewReader("alpha's data"))
	s.do("DELETE", "/v1/sandboxes/"+a.ID, s.key, nil, nil)

	// Later creates never get a's sandbox back, nor anything of it.
	seen := map[string]bool{a.ID: true}
	for i := 0; i < 4; i++ {
		var b sandboxView
		if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{}, &b); code != 201 {
			t.Fatalf("create %d: %d", i, code)
		}
		if seen[b.ID] {
			t.Fatalf("sandbox %s handed out twice", b.ID)
		}
		seen[b.ID] = true
		if r := s.sh(b.ID, "echo [$TENANT]; ls /home/user/alpha-secret.txt 2>&1 | grep -c 'No such'"); r.Stdout != "[]\n1\n" {
			t.Errorf("sandbox %d sees another tenant's state: %+v", i, r)
		}
		s.do("DELETE", "/v1/sandboxes/"+b.ID, s.key, nil, nil)
	}
	// A claim with a network policy binds it through the agent (the
	// proxy endpoint and its variables appear).
	waitFor(t, "a warm sandbox", 90*time.Second, func() bool { return pooledCount(t, s) >= 1 })
	var n sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"network": map[string]any{"allow": []string{"example.com"}}}, &n); code != 201 {
		t.Fatalf("create with network: %d", code)
	}
	if r := s.sh(n.ID, "echo $HTTPS_PROXY"); !strings.Contains(r.Stdout, "127.0.0.1:3128") {
		t.Errorf("claimed sandbox with a network policy: %+v", r)
	}
	s.do("DELETE", "/v1/sandboxes/"+n.ID, s.key, nil, nil)
	// A warm create is answered before the identity reaches the agent:
	// whatever comes right after it (a destroy, a pause) waits for it
	// and works; nothing of the sandbox leaks.
	waitFor(t, "a warm sandbox", 90*time.Second, func() bool { return pooledCount(t, s) >= 1 })
	var k sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{}, &k); code != 201 {
		t.Fatalf("create: %d", code)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+k.ID, s.key, nil, nil); code != 204 {
		t.Errorf("destroy right after a warm create: %d", code)
	}
	waitFor(t, "the destroyed sandbox's state dir to go", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(s.data, "sandboxes", k.ID))
		return os.IsNotExist(err)
	})
	waitFor(t, "a warm sandbox", 90*time.Second, func() bool { return pooledCount(t, s) >= 1 })
	var pz sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"env": map[string]string{"TENANT": "gamma"}}, &pz); code != 201 {
		t.Fatalf("create: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+pz.ID+"/pause", s.key, nil, nil); code != 200 {
		t.Errorf("pause right after a warm create: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+pz.ID+"/resume", s.key, nil, nil); code != 200 {
		t.Errorf("resume: %d", code)
	}
	if r := s.sh(pz.ID, "echo $TENANT"); r.Stdout != "gamma\n" {
		t.Errorf("identity after pause/resume right after a warm create: %+v", r)
	}
	s.do("DELETE", "/v1/sandboxes/"+pz.ID, s.key, nil, nil)
	// Pooled sandboxes are not visible to anyone.
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes", s.key, nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("listed: %+v", list.Sandboxes)
	}
	// The adaptive target may have grown with the burst of creates.
	waitFor(t, "the pool to refill", 90*time.Second, func() bool { return pooledCount(t, s) >= 2 })
	// Graceful shutdown drains the pool: no runsc of this data dir is left.
	s.stop(false)
	waitFor(t, "pooled sandboxes to be destroyed", 60*time.Second, func() bool { return len(runscProcs(s.data)) == 0 })
}

// TestOrphanCgroupsRemovedAtStart: empty sandbox cgroups left by sandboxes
// killed without their cleanup are removed when a server starts; recent
// ones (a create in progress, maybe another server's) are left alone.
func TestOrphanCgroupsRemovedAtStart(t *testing.T) {
	old := time.Now().Add(-time.Hour)
	orphan, fresh := fmt.Sprintf("sb-e2eorphan%d", os.Getpid()), fmt.Sprintf("sb-e2efresh%d", os.Getpid())
	for _, id := range []string{orphan, fresh} {
		for _, c := range []string{"pids", "memory"} {
			d := filepath.Join("/sys/fs/cgroup", c, "space", id)
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if id == orphan {
				os.Chtimes(d, old, old)
			}
			t.Cleanup(func() { os.Remove(d) })
		}
	}
	s := startServer(t, "", "--pool-size", "-1")
	waitFor(t, "the sweep's log line", 30*time.Second, func() bool { return strings.Contains(s.logText(), "removed orphaned sandbox cgroups") })
	for _, c := range []string{"pids", "memory"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "space", orphan)); err == nil {
			t.Errorf("the orphan's %s cgroup is still there", c)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "space", fresh)); err != nil {
			t.Errorf("the fresh %s cgroup was removed: %v", c, err)
		}
	}
}

// poolReady reads space_pool_ready for a template (0 when not reported).
func poolReady(t *testing.T, s *server, template string) int {
	return int(metric(t, s, `space_pool_ready{template="`+template+`"}`))
}

// TestWarmPoolPerTemplate: --pools keeps a warm pool of a template other
// than the default, here of 2 CPUs; it waits until the template is built
// in this data dir, then serves that template's creates of its shape, with
// that template's files, while the default template's creates are served
// from their own pool.
func TestWarmPoolPerTemplate(t *testing.T) {
	s := startServer(t, "", "--pool-size", "1", "--pools", "python-data=1::2", "--snapshot-interval", "-1")
	waitFor(t, "the base pool to fill", 90*time.Second, func() bool { return poolReady(t, s, "base") == 1 })
	if !strings.Contains(s.logText(), `warm pool waits for its template: build it to start the pool" template=python-data`) {
		t.Errorf("the server did not say that python-data's pool waits for its build")
	}
	if n := poolReady(t, s, "python-data"); n > 0 {
		t.Fatalf("python-data's pool has %d ready before the template was built here", n)
	}
	// GET /v1/pools shows it waiting.
	var waiting struct{ Pools []poolSetting }
	if code := s.do("GET", "/v1/pools", s.key, nil, &waiting); code != 200 || len(waiting.Pools) != 2 ||
		waiting.Pools[1].Template != "python-data" || waiting.Pools[1].State != "waiting_for_template" || waiting.Pools[1].CPU != 2 || waiting.Pools[1].Source != "flags" {
		t.Errorf("GET /v1/pools before the build: %d %+v, want python-data waiting for its template", code, waiting.Pools)
	}
	s.buildTemplate("python-data")
	waitFor(t, "the python-data pool to fill", 120*time.Second, func() bool { return poolReady(t, s, "python-data") == 1 })

	// Operators see them: GET /v1/pools (admin only) and `space pools`.
	var pools struct {
		Pools []struct {
			Template, Driver              string
			Size, Max, Target, Ready, CPU int
			MemoryMB                      int `json:"memory_mb"`
		}
	}
	if code := s.do("GET", "/v1/pools", s.key, nil, &pools); code != 200 || len(pools.Pools) != 2 {
		t.Fatalf("GET /v1/pools: %d %+v, want the two pools", code, pools)
	}
	for i, want := range []struct {
		template string
		cpu      int
	}{{"base", 1}, {"python-data", 2}} {
		p := pools.Pools[i]
		if p.Template != want.template || p.CPU != want.cpu || p.Driver != "gvisor" || p.Size != 1 || p.Max != 4 || p.Ready != 1 || p.Target != 1 || p.MemoryMB != 512 {
			t.Errorf("pool %d: %+v, want %s with %d CPUs on gvisor, 1 of 1 ready", i, p, want.template, want.cpu)
		}
	}
	if code := s.do("GET", "/v1/pools", s.teamKey("pool-viewer"), nil, nil); code != 403 {
		t.Errorf("GET /v1/pools with a team's key: %d, want 403", code)
	}
	cmd := exec.Command(spaceBin(t), "pools")
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^python-data\s+gvisor\s+2\s+512 MiB\s+running\s+1\s+1\s+1\s+4\s+boot\s+flags\s+-$`).Match(out) {
		t.Errorf("space pools: %v\n%s", err, out)
	}

	for _, c := range []struct {
		template, check string
		cpu             int
	}{
		{"python-data", "python3 -c 'import pandas; print(\"pandas\")'", 2},
		{"base", "python3 -c 'import pandas' 2>/dev/null || echo 'no pandas'", 1},
	} {
		var sb sandboxView
		if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"template": c.template, "cpu": c.cpu}, &sb); code != 201 {
			t.Fatalf("create %s: %d", c.template, code)
		}
		if sb.Template != c.template || sb.CPU != c.cpu {
			t.Errorf("create of %s with %d CPUs made a sandbox of %s with %d", c.template, c.cpu, sb.Template, sb.CPU)
		}
		// The server's log reaches the harness through a pipe, a moment
		// after the answer.
		waitFor(t, c.template+" sandbox "+sb.ID+" to be logged as served from its pool", 10*time.Second, func() bool {
			return strings.Contains(s.logText(), `sandbox created from the warm pool" sandbox=`+sb.ID+` template=`+c.template)
		})
		want := map[string]string{"python-data": "pandas\n", "base": "no pandas\n"}[c.template]
		if r := s.sh(sb.ID, c.check); r.Stdout != want {
			t.Errorf("%s sandbox from the pool: %+v, want %q", c.template, r, want)
		}
		s.do("DELETE", "/v1/sandboxes/"+sb.ID, s.key, nil, nil)
	}
}

// poolSetting is PUT and DELETE /v1/pools/{template}'s answer.
type poolSetting struct {
	Template, Driver, Source, State string
	Size, Max, CPU                  int
	MemoryMB                        int       `json:"memory_mb"`
	UpdatedAt                       time.Time `json:"updated_at"`
}

// poolsNow is GET /v1/pools.
func poolsNow(t *testing.T, s *server) []poolSetting {
	t.Helper()
	var out struct{ Pools []poolSetting }
	if code := s.do("GET", "/v1/pools", s.key, nil, &out); code != 200 {
		t.Fatalf("GET /v1/pools: %d", code)
	}
	return out.Pools
}

// TestPoolSettings: an admin changes a warm pool while the server runs
// (PUT /v1/pools/{template}, `space pools set`); the change applies at
// once, is kept across a restart, replaces the command line's pool until
// DELETE (`space pools reset`) brings that back, and size 0 turns a pool
// off. Bad settings get a JSON error and change nothing; a team's key
// cannot change pools.
func TestPoolSettings(t *testing.T) {
	s := startServer(t, "", "--pool-size", "1", "--snapshot-interval", "-1")
	waitFor(t, "the base pool to fill", 90*time.Second, func() bool { return poolReady(t, s, "base") == 1 })
	flagsPool := func(what string) {
		t.Helper()
		if ps := poolsNow(t, s); len(ps) != 1 || ps[0].Template != "base" || ps[0].Size != 1 || ps[0].Max != 4 || ps[0].Source != "flags" || ps[0].State != "running" {
			t.Fatalf("%s: pools %+v, want the command line's base pool of 1", what, ps)
		}
	}
	flagsPool("at start")

	var e apiError
	if code := s.do("PUT", "/v1/pools/base", s.teamKey("pool-tenant"), map[string]int{"size": 8}, &e); code != 403 || e.Error != "permission_denied" {
		t.Errorf("a team's key set a pool: %d %+v", code, e)
	}
	if code := s.do("DELETE", "/v1/pools/base", s.teamKey("pool-tenant"), nil, &e); code != 403 {
		t.Errorf("a team's key reset a pool: %d %+v", code, e)
	}
	for _, c := range []struct {
		path string
		body any
		code int
		want string
	}{
		{"/v1/pools/base", map[string]any{}, 400, "give size"},
		{"/v1/pools/base", map[string]any{"size": -1}, 400, "pool size -1"},
		{"/v1/pools/base", map[string]any{"size": 65}, 400, "pool size 65"},
		{"/v1/pools/base", map[string]any{"size": 2, "max": 1}, 400, "pool max 1"},
		{"/v1/pools/base", map[string]any{"size": 1, "driver": "qemu"}, 400, "not enabled"},
		{"/v1/pools/base", map[string]any{"size": 1, "memory_mb": 1}, 400, "memory"},
		{"/v1/pools/base", map[string]any{"size": 0, "max": 4}, 400, "size 0 is off"},
		{"/v1/pools/base", map[string]any{"size": 1, "prestart": true}, 400, "start no process"},
		{"/v1/pools/base", map[string]any{"size": 1, "sizes": 2}, 400, "unknown field"},
		{"/v1/pools/base", "[1]", 400, "JSON object"},
		{"/v1/pools/nope", map[string]any{"size": 1}, 404, "no built-in template"},
	} {
		var e apiError
		if code := s.do("PUT", c.path, s.key, c.body, &e); code != c.code || !strings.Contains(e.Message, c.want) {
			t.Errorf("PUT %s %v: %d %+v, want %d with %q", c.path, c.body, code, e, c.code, c.want)
		}
	}
	if code := s.do("DELETE", "/v1/pools/base", s.key, nil, &e); code != 404 || e.Error != "not_found" {
		t.Errorf("DELETE of a pool never set: %d %+v, want 404", code, e)
	}
	flagsPool("after the refused settings")

	// Grown: applies at once and refills.
	var p poolSetting
	if code := s.do("PUT", "/v1/pools/base", s.key, map[string]int{"size": 2}, &p); code != 200 ||
		p.Source != "api" || p.State != "running" || p.Size != 2 || p.Max != 8 || p.Driver != "gvisor" || p.MemoryMB != 512 || p.CPU != 1 || p.UpdatedAt.IsZero() {
		t.Fatalf("PUT size 2: %d %+v", code, p)
	}
	waitFor(t, "the grown pool to fill", 90*time.Second, func() bool { return poolReady(t, s, "base") == 2 })
	if ps := poolsNow(t, s); len(ps) != 1 || ps[0].Size != 2 || ps[0].Source != "api" {
		t.Fatalf("pools after PUT: %+v", ps)
	}

	// A template not built in this data dir waits for its build.
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(spaceBin(t), args...)
		cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("space %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := cli("pools", "set", "python-data", "1", "--cpu", "2"); !strings.Contains(out, "python-data on gvisor: size 1, max 4, 512 MiB, 2 CPU (source api): waiting for template") {
		t.Errorf("space pools set python-data: %q", out)
	}
	if ps := poolsNow(t, s); len(ps) != 2 || ps[1].Template != "python-data" || ps[1].State != "waiting_for_template" || ps[1].CPU != 2 || ps[1].Source != "api" {
		t.Errorf("pools with python-data set: %+v, want it waiting for its template", ps)
	}
	if out := cli("pools", "reset", "python-data"); !strings.Contains(out, "python-data on gvisor: no pool (source none)") {
		t.Errorf("space pools reset python-data: %q", out)
	}

	// Kept across a restart.
	s.stop(false)
	s.start()
	waitFor(t, "the pool set through the API to fill after the restart", 90*time.Second, func() bool { return poolReady(t, s, "base") == 2 })
	if ps := poolsNow(t, s); len(ps) != 1 || ps[0].Size != 2 || ps[0].Max != 8 || ps[0].Source != "api" {
		t.Fatalf("pools after the restart: %+v", ps)
	}
	if out := cli("pools"); !regexp.MustCompile(`(?m)^base\s+gvisor\s+1\s+512 MiB\s+running\s+2\s+2\s+2\s+8\s+boot\s+api\s+-$`).MatchString(out) {
		t.Errorf("space pools after the restart:\n%s", out)
	}

	// Reset: the command line's pool again, the surplus destroyed at once.
	if code := s.do("DELETE", "/v1/pools/base", s.key, nil, &p); code != 200 || p.Source != "flags" || p.Size != 1 || p.State != "running" {
		t.Fatalf("DELETE: %d %+v", code, p)
	}
	flagsPool("after DELETE")
	if n := poolReady(t, s, "base"); n != 1 {
		t.Errorf("after DELETE the pool holds %d ready, want 1 at once", n)
	}

	// Off, and still off after a restart; a create is then cold.
	if out := cli("pools", "set", "base", "0"); !strings.Contains(out, "base on gvisor: no pool (source api)") {
		t.Errorf("space pools set base 0: %q", out)
	}
	off := func(what string) {
		t.Helper()
		if ps := poolsNow(t, s); len(ps) != 1 || ps[0].State != "off" || ps[0].Source != "api" || ps[0].Size != 0 {
			t.Fatalf("pools %s: %+v, want base off by its setting", what, ps)
		}
	}
	off("after size 0")
	waitFor(t, "the stopped pool's sandboxes to be destroyed", 30*time.Second, func() bool { return pooledCount(t, s) == 0 })
	s.stop(false)
	before := len(s.logText())
	s.start()
	id := s.create(nil)
	if after := s.logText()[before:]; strings.Contains(after, "warm pool started") || strings.Contains(after, `sandbox created from the warm pool" sandbox=`+id) {
		t.Errorf("a pool turned off through the API started after a restart")
	}
	if n := pooledCount(t, s); n != 0 {
		t.Errorf("%d pooled sandboxes with the pool off", n)
	}
	off("after a restart")
	if code := s.do("DELETE", "/v1/pools/base", s.key, nil, &p); code != 200 || p.Source != "flags" || p.Size != 1 {
		t.Fatalf("DELETE of size 0: %d %+v", code, p)
	}
	waitFor(t, "the command line's pool to fill again", 90*time.Second, func() bool { return poolReady(t, s, "base") == 1 })
}
