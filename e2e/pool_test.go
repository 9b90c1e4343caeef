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
	if err != nil || !regexp.MustCompile(`(?m)^python-data\s+gvisor\s+2\s+512 MiB\s+1\s+1\s+1\s+4\s+boot\s+-$`).Match(out) {
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
