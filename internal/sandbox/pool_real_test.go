package sandbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/egress"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/testenv"
)

// realService is a Service on the real gVisor driver with a store file of
// its own, the built base template recorded as "base". Its sandboxes are
// destroyed and its pools drained when the test ends.
func realService(t *testing.T) (*Service, *store.Store, store.Template) {
	t.Helper()
	return realServiceWith(t, nil)
}

// realServiceWith is realService with its gVisor driver passed through
// wrap (a test's failure injection) when wrap is not nil.
func realServiceWith(t *testing.T, wrap func(driver.Driver) driver.Driver) (*Service, *store.Store, store.Template) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts gVisor sandboxes")
	}
	runsc, agentPath, base := testenv.Runsc(t), testenv.Agent(t), testenv.Base(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := gvisor.New(ctx, gvisor.Config{Runsc: runsc, Root: filepath.Join(dir, "runsc"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	var drv driver.Driver = d
	if wrap != nil {
		drv = wrap(d)
	}
	svc := New(Config{DataDir: dir, AgentPath: agentPath, DefaultDriver: gvisor.Name, DefaultTemplate: "base"},
		st, []driver.Driver{drv}, log, NewMetrics(prometheus.NewRegistry(), st.CountSandboxesByState))
	tpl := store.Template{Name: "base", Digest: base.Digest, Path: base.Path, Kind: string(base.Kind), Status: store.TemplateReady, BuiltAt: base.BuiltAt}
	if err := st.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.StopPools()
		all, _, _ := st.ListSandboxes(context.Background(), store.SandboxFilter{Limit: store.MaxListLimit})
		for _, sb := range all {
			_ = svc.Kill(context.Background(), Caller{Admin: true}, sb.ID)
		}
		svc.Shutdown()
		st.Close()
	})
	return svc, st, tpl
}

// pooledIDs returns the ids of the pooled sandboxes recorded, by template
// digest.
func pooledIDs(t *testing.T, st *store.Store) map[string]string {
	t.Helper()
	sbs, _, err := st.ListSandboxes(context.Background(), store.SandboxFilter{States: []string{StatePooled}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, sb := range sbs {
		out[sb.ID] = sb.TemplateDigest
	}
	return out
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPoolFollowsTemplateRebuild: a template rebuilt from a new recipe (a
// new digest under the same name) retires the pool of the old digest
// (its warm sandboxes destroyed: creates look for the new digest and
// would never claim them) and a pool of the new digest serves creates;
// starting a running pool again changes nothing; a template without a
// pool is created cold and never takes another template's warm sandbox.
func TestPoolFollowsTemplateRebuild(t *testing.T) {
	svc, st, v1 := realService(t)
	ctx := context.Background()
	cfg := PoolConfig{Template: "base", Size: 1}
	svc.StartPool(ctx, v1, cfg)
	waitUntil(t, "the first pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	old := pooledIDs(t, st)
	if len(old) != 1 {
		t.Fatalf("pooled sandboxes after the first fill: %v, want one", old)
	}
	var oldID string
	for id := range old {
		oldID = id
	}

	// Another template (here the same files under another name and
	// digest) has no pool: its create is cold and leaves base's warm
	// sandbox in the pool.
	other := v1
	other.Name, other.Digest = "other", "sha256:"+v1.Digest[len(v1.Digest)-8:]+"-other"
	if err := st.PutTemplate(ctx, other); err != nil {
		t.Fatal(err)
	}
	sb, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{Template: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == oldID || sb.TemplateDigest != other.Digest {
		t.Fatalf("create of template other got %s (digest %s); want a cold sandbox of its own digest", sb.ID, sb.TemplateDigest)
	}
	if n := svc.PoolReady()["base"]; n != 1 {
		t.Fatalf("base pool after another template's create: %d ready, want 1", n)
	}

	// The rebuild: same name, new digest.
	v2 := v1
	v2.Digest = "sha256:" + v1.Digest[len(v1.Digest)-8:] + "-rebuilt"
	if err := st.PutTemplate(ctx, v2); err != nil {
		t.Fatal(err)
	}
	svc.StartPool(ctx, v2, cfg)
	waitUntil(t, "the old pool's sandbox to be destroyed and the new pool to fill", func() bool {
		now := pooledIDs(t, st)
		_, stale := now[oldID]
		return !stale && len(now) == 1 && svc.PoolReady()["base"] == 1
	})
	if _, err := os.Stat(filepath.Join(svc.cfg.DataDir, "sandboxes", oldID)); !os.IsNotExist(err) {
		t.Errorf("retired warm sandbox %s left its state dir: %v", oldID, err)
	}
	var newID string
	for id, digest := range pooledIDs(t, st) {
		if digest != v2.Digest {
			t.Fatalf("pooled sandbox %s has digest %s, want the rebuilt %s", id, digest, v2.Digest)
		}
		newID = id
	}
	// Running already: nothing happens (StartPool decides under the
	// pools' lock before it returns).
	svc.StartPool(ctx, v2, cfg)
	if ps := svc.Pools(); len(ps) != 1 || ps[0].Digest != v2.Digest {
		t.Fatalf("starting a running pool again changed the pools: %+v", ps)
	}
	if now := pooledIDs(t, st); len(now) != 1 || now[newID] == "" {
		t.Fatalf("starting a running pool again changed it: %v", now)
	}

	claimed, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if claimed.ID != newID || claimed.TemplateDigest != v2.Digest {
		t.Fatalf("create of base got %s (digest %s), want the rebuilt pool's %s", claimed.ID, claimed.TemplateDigest, newID)
	}
	for _, id := range []string{sb.ID, claimed.ID} {
		if pid, err := svc.Exec(ctx, Caller{Team: "t"}, id, ExecRequest{Cmd: []string{"true"}}); err != nil || pid <= 0 {
			t.Errorf("exec in %s: pid %d, %v", id, pid, err)
		}
	}
}

// TestPoolShrinksAfterBurst: a pool that grew with its create rate gives
// the extra warm sandboxes back once the rate fell and it held them for
// poolShrinkAfter (here shortened), down to its base size, destroying
// them; it keeps its base.
func TestPoolShrinksAfterBurst(t *testing.T) {
	svc, st, tpl := realService(t)
	defer func(d time.Duration) { poolShrinkAfter = d }(poolShrinkAfter)
	poolShrinkAfter = 500 * time.Millisecond
	ctx := context.Background()
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1, Max: 3})
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	var p *pool
	svc.pools.mu.Lock()
	for _, q := range svc.pools.byKey {
		p = q
	}
	svc.pools.mu.Unlock()
	// A burst of creates the pool could not serve (10 a second over the
	// last 30 s) raises the target to the maximum.
	p.mu.Lock()
	for i := 0; i < 300; i++ {
		p.demand = append(p.demand, time.Now())
	}
	p.mu.Unlock()
	waitUntil(t, "the pool to grow to its maximum", func() bool { return svc.PoolReady()["base"] == 3 })
	grown := pooledIDs(t, st)

	// The burst is over: the target falls back to the base size, and
	// after poolShrinkAfter the pool destroys the two that waited longest.
	p.mu.Lock()
	p.demand = nil
	p.mu.Unlock()
	waitUntil(t, "the pool to shrink to its base", func() bool { return len(pooledIDs(t, st)) == 1 && svc.PoolReady()["base"] == 1 })
	for id := range grown {
		if _, kept := pooledIDs(t, st)[id]; kept {
			continue
		}
		if _, err := os.Stat(filepath.Join(svc.cfg.DataDir, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("warm sandbox %s given back left its state dir: %v", id, err)
		}
	}
	time.Sleep(2 * poolShrinkAfter)
	if n := svc.PoolReady()["base"]; n != 1 {
		t.Errorf("pool at its base went on shrinking: %d ready", n)
	}
}

// TestSetPool: a running pool changes size while the server runs. Grown,
// it refills to the new size; shrunk, it destroys the surplus at once
// (not after poolShrinkAfter); given another memory, the old pool and its
// sandboxes go and one of the new shape fills and serves creates of it;
// at size 0 it stops and nothing of it is left. Bad settings are refused
// and change nothing.
func TestSetPool(t *testing.T) {
	svc, st, tpl := realService(t)
	ctx := context.Background()
	for _, bad := range []PoolConfig{{Size: -1}, {Size: MaxPoolSize + 1}, {Size: 2, Max: 1}, {Size: 1, Max: MaxPoolTarget + 1}, {Size: 1, MemoryMB: 1}, {Size: 1, Driver: "nope"}} {
		if err := svc.SetPool(ctx, tpl, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetPool(%+v) = %v, want invalid argument", bad, err)
		}
	}
	if ps := svc.Pools(); len(ps) != 0 {
		t.Fatalf("refused settings started pools: %+v", ps)
	}
	if err := svc.SetPool(ctx, tpl, PoolConfig{Size: 1, Source: "api"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	first := pooledIDs(t, st)

	if err := svc.SetPool(ctx, tpl, PoolConfig{Size: 3, Max: 5, Source: "api"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the grown pool to fill", func() bool { return svc.PoolReady()["base"] == 3 })
	grown := pooledIDs(t, st)
	for id := range first {
		if grown[id] == "" {
			t.Errorf("growing the pool destroyed its warm sandbox %s", id)
		}
	}
	ps := svc.Pools()
	if len(ps) != 1 || ps[0].Size != 3 || ps[0].Max != 5 || ps[0].Target != 3 || ps[0].Source != "api" {
		t.Fatalf("pools after growing: %+v", ps)
	}

	// Shrunk: the surplus leaves the pool before SetPool returns, and is
	// destroyed soon after.
	if err := svc.SetPool(ctx, tpl, PoolConfig{Size: 1, Source: "api"}); err != nil {
		t.Fatal(err)
	}
	if n := svc.PoolReady()["base"]; n != 1 {
		t.Fatalf("shrunk pool holds %d ready, want 1 at once", n)
	}
	waitUntil(t, "the surplus to be destroyed", func() bool { return len(pooledIDs(t, st)) == 1 })
	for id := range grown {
		if pooledIDs(t, st)[id] != "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(svc.cfg.DataDir, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("warm sandbox %s destroyed by the shrink left its state dir: %v", id, err)
		}
	}
	if ps := svc.Pools(); len(ps) != 1 || ps[0].Size != 1 || ps[0].Max != 4 {
		t.Fatalf("pools after shrinking: %+v", ps)
	}

	// Another memory: another shape. The old pool is retired, and a
	// create of the new memory is served warm.
	kept := pooledIDs(t, st)
	if err := svc.SetPool(ctx, tpl, PoolConfig{Size: 1, MemoryMB: 384, Source: "api"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the old shape to go and the new one to fill", func() bool {
		now := pooledIDs(t, st)
		for id := range kept {
			if now[id] != "" {
				return false
			}
		}
		return len(now) == 1 && svc.PoolReady()["base"] == 1
	})
	if ps := svc.Pools(); len(ps) != 1 || ps[0].MemoryMB != 384 {
		t.Fatalf("pools after the new memory: %+v", ps)
	}
	var warmID string
	for id := range pooledIDs(t, st) {
		warmID = id
	}
	sb, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{Template: "base", MemoryMB: 384})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != warmID {
		t.Errorf("create of 384 MiB got %s, want the warm %s", sb.ID, warmID)
	}

	// Off: the pool stops, its sandboxes (and the refill the claim
	// started) are destroyed, and the claimed sandbox is untouched.
	if err := svc.SetPool(ctx, tpl, PoolConfig{Size: 0, MemoryMB: 384}); err != nil {
		t.Fatal(err)
	}
	if ps := svc.Pools(); len(ps) != 0 {
		t.Fatalf("pools after size 0: %+v", ps)
	}
	waitUntil(t, "the stopped pool's sandboxes to be destroyed", func() bool { return len(pooledIDs(t, st)) == 0 })
	if pid, err := svc.Exec(ctx, Caller{Team: "t"}, sb.ID, ExecRequest{Cmd: []string{"true"}}); err != nil || pid <= 0 {
		t.Errorf("exec in the claimed sandbox after its pool stopped: pid %d, %v", pid, err)
	}
}

// TestNoPoolAfterStopPools: once StopPools (Shutdown) began, nothing
// starts, grows or replaces a pool, whether pools ran before (a setting
// applied during the shutdown) or none did (a template build that ended
// after it): no warm sandbox outlives the server's stop.
func TestNoPoolAfterStopPools(t *testing.T) {
	ctx := context.Background()
	svc, st, tpl := realService(t)
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1})
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	svc.StopPools()
	for _, cfg := range []PoolConfig{{Size: 2}, {Size: 1, MemoryMB: 256}} {
		if err := svc.SetPool(ctx, tpl, cfg); err != nil {
			t.Errorf("SetPool(%+v) after StopPools: %v", cfg, err)
		}
	}
	svc.StopPool("base", "")

	idle, _, idleTpl := realService(t) // never had a pool
	idle.StopPools()
	idle.StartPool(ctx, idleTpl, PoolConfig{Template: "base", Size: 1})

	time.Sleep(2 * time.Second) // a refill, had one started, would be booting
	for name, svc := range map[string]*Service{"stopped": svc, "never started": idle} {
		if ps := svc.Pools(); len(ps) != 0 {
			t.Errorf("%s: pools after StopPools: %+v", name, ps)
		}
	}
	if ids := pooledIDs(t, st); len(ids) != 0 {
		t.Errorf("warm sandboxes after StopPools: %v", ids)
	}
	if ids := pooledIDs(t, idle.store); len(ids) != 0 {
		t.Errorf("warm sandboxes of a service that had no pool, after StopPools: %v", ids)
	}
}

// TestPoolDropsDeadWarm: a warm sandbox whose instance stopped while it
// waited (killed from the host, as the host's OOM killer would) is taken
// out of the pool and replaced; no create gets it.
func TestPoolDropsDeadWarm(t *testing.T) {
	ctx := context.Background()
	svc, st, tpl := realService(t)
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1})
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	var dead string
	for id := range pooledIDs(t, st) {
		dead = id
	}
	killed := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, _ := os.ReadFile(f)
		if !bytes.Contains(b, []byte(dead)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed == 0 {
		t.Fatalf("no host process of the warm sandbox %s found", dead)
	}
	waitUntil(t, "the dead warm sandbox to be replaced", func() bool {
		_, still := pooledIDs(t, st)[dead]
		return !still && svc.PoolReady()["base"] == 1
	})
	sb, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == dead {
		t.Fatalf("a create got the dead warm sandbox %s", dead)
	}
	if code := exitCode(t, svc, sb.ID, "true"); code != 0 {
		t.Errorf("exec in the created sandbox: exit %d", code)
	}
}

// TestForkFollowsIdentity: a process started to follow the identity (the
// E2B kernels) is given, in a fork's child, the child's identity on its
// stdin (so its copy runs with the child's env and placeholders); the
// parent's own process gets nothing more, and a process that does not
// follow gets nothing.
func TestForkFollowsIdentity(t *testing.T) {
	ctx := context.Background()
	svc, _, _ := realService(t)
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{Env: map[string]string{"TENANT": "alpha"}})
	if err != nil {
		t.Fatal(err)
	}
	echo := []string{"/bin/sh", "-c", `while read l; do echo "got $l"; done`}
	follower, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: echo, OpenStdin: true, Background: true, FollowIdentity: true})
	if err != nil {
		t.Fatal(err)
	}
	other, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: echo, OpenStdin: true, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	kids, err := svc.Fork(ctx, c, sb.ID, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	// stdout reads what a process printed so far.
	stdout := func(id string, pid int) string {
		t.Helper()
		evs, err := svc.Events(ctx, c, id, pid, 1, false)
		if err != nil {
			t.Fatal(err)
		}
		return stdoutOf(evs)
	}
	child := kids[0].ID
	want := `got {"init":{"env":{"TENANT":"alpha"}}}`
	waitUntil(t, "the child's identity on the following process's stdin", func() bool {
		return strings.Contains(stdout(child, follower), want)
	})
	if out := stdout(child, other); out != "" {
		t.Errorf("child: a process not following the identity was written to: %q", out)
	}
	if out := stdout(sb.ID, follower); out != "" {
		t.Errorf("parent: the following process got %q; the parent's identity did not change", out)
	}
}

// TestPoolPrestart: a pool starts its Prestart process in each warm
// sandbox, with its file written, and lets the sandbox join once the
// process said it is ready. A create that keeps it finds the same process
// running, tagged, and the process got the owner's env on its stdin at
// the claim; any other create finds no process it did not start, in the
// agent's list or in the sandbox.
func TestPoolPrestart(t *testing.T) {
	svc, st, tpl := realService(t)
	ctx := context.Background()
	ps := &Prestart{
		Files:   map[string][]byte{"/tmp/prestart/run.sh": []byte(`echo "pool env: [$OWNER]"; echo loaded > /tmp/prestart/cache; sleep 0.3; echo READY; read line; echo "claim: $line"; exec sleep 600` + "\n")},
		Discard: []string{"/tmp/prestart"},
		Start:   agentproto.StartRequest{Cmd: []string{"/bin/sh", "/tmp/prestart/run.sh"}, Tag: "prestarted"},
		Ready:   []byte("READY\n"),
	}
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1, Prestart: ps})
	claim := func(keep bool) (string, []agentproto.Process) {
		t.Helper()
		waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
		pooled := pooledIDs(t, st)
		sb, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{Env: map[string]string{"OWNER": "alice"}, KeepPrestarted: keep})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := pooled[sb.ID]; !ok {
			t.Fatalf("create (keep %v) got %s, not the warm sandbox of %v", keep, sb.ID, pooled)
		}
		procs, err := svc.Processes(ctx, Caller{Team: "t"}, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID, procs
	}

	id, procs := claim(true)
	if n := testutil.ToFloat64(svc.metrics.PoolPrestarts.WithLabelValues("base", prestartReady)); n < 1 {
		t.Errorf("space_pool_prestarts_total{template=base,result=ready} = %v after a prestart", n)
	}
	if len(procs) != 1 || procs[0].Tag != "prestarted" || !procs[0].Running {
		t.Fatalf("kept: processes %+v, want the running prestarted one", procs)
	}
	evs, err := svc.Events(ctx, Caller{Team: "t"}, id, procs[0].PID, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	want := `claim: {"init":{"env":{"OWNER":"alice"}}}` + "\n"
	deadline := time.AfterFunc(30*time.Second, func() { evs.Close() })
	for !bytes.Contains(out, []byte(want)) {
		ev, err := evs.Next()
		if err != nil {
			break
		}
		out = append(out, ev.Data...)
	}
	deadline.Stop()
	evs.Close()
	if string(out) != "pool env: []\nREADY\n"+want {
		t.Errorf("prestarted process printed %q, want the pool's empty env, ready, then the claim's line", out)
	}
	if code := exitCode(t, svc, id, "test", "-e", "/tmp/prestart/cache"); code != 0 {
		t.Errorf("kept: `test -e /tmp/prestart/cache` exited %d, want 0 (a kept process keeps its files)", code)
	}

	id, procs = claim(false)
	if len(procs) != 0 {
		t.Errorf("not kept: processes %+v, want none", procs)
	}
	pid, evs, err := svc.Run(ctx, Caller{Team: "t"}, id, ExecRequest{Cmd: []string{"ps", "-eo", "args"}})
	if err != nil {
		t.Fatal(err)
	}
	out = out[:0]
	for {
		ev, err := evs.Next()
		if err != nil {
			break
		}
		out = append(out, ev.Data...)
	}
	evs.Close()
	if bytes.Contains(out, []byte("run.sh")) || bytes.Contains(out, []byte("sleep 600")) {
		t.Errorf("not kept: the prestarted process still runs in the sandbox (ps, pid %d):\n%s", pid, out)
	}
	// Nor is anything it left on disk (its Discard).
	if code := exitCode(t, svc, id, "test", "-e", "/tmp/prestart"); code != 1 {
		t.Errorf("not kept: `test -e /tmp/prestart` exited %d, want 1 (the prestart's files removed)", code)
	}
}

// exitCode runs cmd in sandbox id (team "t") and returns its exit code.
func exitCode(t *testing.T, svc *Service, id string, cmd ...string) int {
	t.Helper()
	_, evs, err := svc.Run(context.Background(), Caller{Team: "t"}, id, ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	for {
		ev, err := evs.Next()
		if err != nil {
			t.Fatalf("%v: no exit: %v", cmd, err)
		}
		if ev.Type == agentproto.EventExit && ev.ExitCode != nil {
			return *ev.ExitCode
		}
	}
}

// A warm claim with a network policy is answered before its delivery. A
// server that died in between leaves, at restart, a running sandbox whose
// agent has no identity: confirmIdentity must give it the network too
// (proxy endpoint and env, the secret's placeholder), not the env alone.
func TestConfirmIdentityBindsNetwork(t *testing.T) {
	svc, st, tpl := realService(t)
	ctx := context.Background()
	dir := t.TempDir()
	cas, err := egress.NewCAStore(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	ring := egress.NewRing(10)
	proxy, err := egress.New(egress.Config{CAs: cas, Audit: ring, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetEgress(Egress{Proxy: proxy, Audit: ring, CAs: cas, SecretsDir: filepath.Join(dir, "secrets")})
	owner := Caller{Team: "t"}
	if _, err := svc.PutSecret(ctx, owner, SecretRequest{Name: "TOKEN", Value: "v-123456", Hosts: []string{"example.com"},
		Inject: egress.Injection{Header: "Authorization", Format: "Bearer {value}"}}); err != nil {
		t.Fatal(err)
	}
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1})
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	var w *warm
	svc.pools.mu.Lock()
	for _, p := range svc.pools.byKey {
		w = <-p.ready
	}
	svc.pools.mu.Unlock()

	// What a claim stores before it answers, and nothing after.
	sb := w.sb
	sb.Team, sb.Env, sb.State = owner.Team, map[string]string{"OWNER": "alice"}, StateRunning
	if err := svc.putNetwork(ctx, sb.ID, &NetworkSpec{Allow: []string{"example.com"}}, []string{"TOKEN"}); err != nil {
		t.Fatal(err)
	}
	if err := st.ClaimSandboxWithin(ctx, sb, store.Quota{}); err != nil {
		t.Fatal(err)
	}
	l := &live{inst: w.inst, agent: w.agent, ready: make(chan struct{})}
	svc.mu.Lock()
	svc.live[sb.ID] = l
	svc.mu.Unlock()
	l.opMu.Lock()
	svc.confirmIdentity(sb, l)

	for name, want := range map[string]string{"OWNER": "alice", "HTTPS_PROXY": "http://127.0.0.1:3128", "TOKEN": "space_ph_"} {
		if got := runEnv(t, w.agent, name); !strings.HasPrefix(got, want) {
			t.Errorf("%s in the sandbox after the late delivery = %q, want %q…", name, got, want)
		}
	}
}
