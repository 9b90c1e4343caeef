package gvisor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/drivertest"
	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/testenv"
)

func TestConformance(t *testing.T) {
	runsc := testenv.Runsc(t)
	agent := testenv.Agent(t)
	tpl := testenv.Base(t)
	root := t.TempDir()
	drivertest.Run(t, drivertest.Setup{
		New: func(t *testing.T) driver.Driver {
			d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: runsc, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec: func(t *testing.T) driver.Spec { return newSpec(root, tpl.Path, agent) },
	})
}

// newSpec is a spec with a fresh id and state dir under root.
func newSpec(root, rootfs, agent string) driver.Spec {
	b := make([]byte, 6)
	rand.Read(b)
	id := "sb-test" + hex.EncodeToString(b)
	return driver.Spec{ID: id, Hostname: "sandbox", Rootfs: rootfs, RootfsKind: "dir",
		StateDir: filepath.Join(root, "sandboxes", id), AgentPath: agent, VCPU: 1, MemoryMB: 256}
}

// The pinned version in Go and in the Makefile must agree: the Makefile
// builds what the server looks for.
func TestPinnedVersionMatchesMakefile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUNSC_VERSION\s*:?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil || string(m[1]) != gvisor.PinnedVersion {
		t.Fatalf("Makefile RUNSC_VERSION = %q, gvisor.PinnedVersion = %q", m, gvisor.PinnedVersion)
	}
	// And the build name (version and patches' digest) where the server
	// looks for the build.
	out, err := exec.Command("make", "-s", "-C", testenv.RepoRoot(), "print-runsc-build").Output()
	if got := strings.TrimSpace(string(out)); err != nil || got != gvisor.BuildName() {
		t.Fatalf("make print-runsc-build = %q, %v; gvisor.BuildName() = %q", got, err, gvisor.BuildName())
	}
}

// Destroy leaves no cgroup behind: neither for a sandbox that ran nor for
// one whose start was cut short after runsc made its cgroups (simulated by
// making one by hand).
func TestDestroyRemovesCgroups(t *testing.T) {
	d, spec := newDriver(t)
	cgroups := func(id string) []string {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/space", id))
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/space", id)); err == nil {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup/space", id))
		}
		return dirs
	}
	ctx := t.Context()

	ran := spec()
	inst, err := d.Create(ctx, ran)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Start(ctx); err != nil {
		inst.Destroy(ctx)
		t.Fatal(err)
	}
	if len(cgroups(ran.ID)) == 0 {
		t.Log("runsc made no cgroup under space/ on this host; checking removal only")
	}
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := cgroups(ran.ID); len(left) > 0 {
		t.Errorf("cgroups left after Destroy: %v", left)
	}

	cut := spec()
	inst, err = d.Create(ctx, cut)
	if err != nil {
		t.Fatal(err)
	}
	made := filepath.Join("/sys/fs/cgroup/cpu/space", cut.ID)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		made = filepath.Join("/sys/fs/cgroup/space", cut.ID)
	}
	if err := os.MkdirAll(made, 0o755); err != nil {
		inst.Destroy(ctx)
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := cgroups(cut.ID); len(left) > 0 {
		os.Remove(made)
		t.Errorf("cgroups left after Destroy of an unstarted sandbox: %v", left)
	}
}

// A checkpoint restores after an upgrade of space: the sandbox ran an agent
// binary that was then rewritten in place, and a mount layout older than
// this build's (no /tmp mount: before /tmp was bounded); the restore is
// given an agent path holding something else. The running sandbox keeps
// its agent, the restored one runs the agent it was checkpointed with, with
// its /tmp files and processes. An image made by another runsc build is
// refused with a clear conflict, leaving nothing behind.
func TestRestoreAcrossUpgrade(t *testing.T) {
	runsc := testenv.Runsc(t)
	tpl := testenv.Base(t)
	root := t.TempDir()
	ctx := t.Context()
	d, err := gvisor.New(ctx, gvisor.Config{Runsc: runsc, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(root, "space-agent")
	b, err := os.ReadFile(testenv.Agent(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, b, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := func() driver.Spec { return newSpec(root, tpl.Path, agent) }
	parent := spec()
	inst, err := d.Create(ctx, parent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Destroy(context.Background()) })
	// The layout of an older build: no /tmp mount in the spec...
	cfgPath := filepath.Join(parent.StateDir, "bundle", "config.json")
	var cfg map[string]any
	if b, err = os.ReadFile(cfgPath); err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	var mounts []any
	for _, m := range cfg["mounts"].([]any) {
		if m.(map[string]any)["destination"] != "/tmp" {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) == len(cfg["mounts"].([]any)) {
		t.Fatal("the spec has no /tmp mount to take out")
	}
	cfg["mounts"] = mounts
	// ...and its process ran with noNewPrivileges (before setuid was
	// allowed): a restore must keep what the checkpoint recorded, or
	// runsc refuses its spec.
	cfg["process"].(map[string]any)["noNewPrivileges"] = true
	if b, err = json.Marshal(cfg); err == nil {
		err = os.WriteFile(cfgPath, b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(inst.DialAgent, slog.Default())
	t.Cleanup(func() { c.Close() })
	if out, code := drivertest.Exec2(t, c, "user", "echo kept > /tmp/x && (sleep 3600 >/dev/null 2>&1 &) && echo started"); code != 0 || out != "started\n" {
		t.Fatalf("setup: %q, exit %d", out, code)
	}
	// The server's agent binary is rewritten in place (an upgrade by cp).
	if err := os.WriteFile(agent, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, code := drivertest.Exec2(t, c, "user", "cat /tmp/x"); code != 0 || out != "kept\n" {
		t.Fatalf("running sandbox after its agent binary was rewritten: %q, exit %d", out, code)
	}
	img := filepath.Join(root, "image")
	if err := inst.(driver.Checkpointer).Checkpoint(ctx, img, true); err != nil {
		t.Fatal(err)
	}

	child := spec()
	kid, err := d.Restore(ctx, child, img)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Cleanup(func() { kid.Destroy(context.Background()) })
	kc := agentclient.New(kid.DialAgent, slog.Default())
	t.Cleanup(func() { kc.Close() })
	if out, code := drivertest.Exec2(t, kc, "user", "cat /tmp/x; pgrep -x sleep >/dev/null && echo sleeping"); code != 0 || out != "kept\nsleeping\n" {
		t.Fatalf("restored sandbox: %q, exit %d", out, code)
	}

	// An image from another runsc build.
	stamp := filepath.Join(img, "space-image.json")
	var st map[string]string
	if b, err = os.ReadFile(stamp); err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil || st["runsc_sha256"] == "" || st["agent_sha256"] == "" {
		t.Fatalf("image stamp %v: %v", st, err)
	}
	st["runsc_sha256"] = strings.Repeat("0", 64)
	b, _ = json.Marshal(st)
	if err := os.WriteFile(stamp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	other := spec()
	got, err := d.Restore(ctx, other, img)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "another runsc build") || got != nil {
		t.Fatalf("Restore of another runsc's image = %v, %v; want a conflict naming runsc and no instance", got, err)
	}
	if _, err := os.Stat(other.StateDir); !os.IsNotExist(err) {
		t.Errorf("refused restore left its state dir: %v", err)
	}
}

// A wait for the agent ends when the sandbox is destroyed: an API call
// waiting on an agent that never came back used to hang after a delete.
func TestDialAgentEndsAtDestroy(t *testing.T) {
	d, spec := newDriver(t)
	inst, err := d.Create(t.Context(), spec())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := inst.DialAgent(context.Background()) // no deadline: only Destroy ends it
		done <- err
	}()
	if err := inst.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("DialAgent after Destroy: %v, want unavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("DialAgent still waiting 30 s after Destroy")
	}
}

// newDriver is a gVisor driver on a fresh root, and a maker of specs of
// the base template for it.
func newDriver(t *testing.T) (*gvisor.Driver, func() driver.Spec) {
	t.Helper()
	runsc := testenv.Runsc(t)
	agent := testenv.Agent(t)
	tpl := testenv.Base(t)
	root := t.TempDir()
	d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: runsc, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	return d, func() driver.Spec { return newSpec(root, tpl.Path, agent) }
}

// A runsc with the features file `make runsc` writes streams its tar (no
// file limit on snapshots); any other is held to the sandbox's room.
func TestExportFileLimitByBuild(t *testing.T) {
	runsc := testenv.Runsc(t)
	for _, streams := range []bool{true, false} {
		dir := t.TempDir()
		link := filepath.Join(dir, "runsc")
		if err := os.Symlink(runsc, link); err != nil {
			t.Fatal(err)
		}
		if streams {
			os.WriteFile(filepath.Join(dir, "features"), []byte("other\ntar-stream\n"), 0o644)
		}
		d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: link, Root: filepath.Join(dir, "root"), GroupCPUShares: -1, Log: slog.Default()})
		if err != nil {
			t.Fatal(err)
		}
		got := d.ExportFileLimitFor(256 << 20)
		if streams && got != math.MaxInt64 || !streams && (got <= 0 || got >= 512<<20) {
			t.Errorf("features %v: limit for a 256 MiB sandbox %d", streams, got)
		}
	}
}

// A start that hangs past its context is not just killed: runsc is asked
// for its goroutines first (SIGQUIT), and the error says where it waited.
// runsc here is a wrapper whose `run` hangs and answers SIGQUIT as Go does.
func TestStartTimeoutSaysWhere(t *testing.T) {
	real := testenv.Runsc(t)
	dir := t.TempDir()
	fake := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\n" +
		"for a; do [ \"$a\" = run ] && { trap 'echo \"SIGQUIT: quit\"; echo \"goroutine 1 [select]:\"; echo main.waitForStart; exit 2' QUIT; sleep 60 & wait $!; exit 1; }; done\n" +
		"exec " + real + " \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer gvisor.SetQuitGrace(5 * time.Second)()
	d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: fake, Root: filepath.Join(dir, "root"), GroupCPUShares: -1, Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	spec := newSpec(dir, testenv.Base(t).Path, testenv.Agent(t))
	inst, err := d.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Destroy(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = inst.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "goroutine 1 [select]:\nmain.waitForStart") {
		t.Fatalf("Start past its context: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Start took %v to give up (it answered SIGQUIT at once)", took)
	}
}

// A destroy that runsc cannot do (here: every delete fails) still ends
// the sandbox: its processes are killed through its cgroup, and the
// destroy succeeds once none is left.
func TestDestroyWhenRunscCannot(t *testing.T) {
	runsc := testenv.Runsc(t)
	d, spec := newDriver(t)
	ctx := t.Context()
	s := spec()
	inst, err := d.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Start(ctx); err != nil {
		inst.Destroy(ctx)
		t.Fatal(err)
	}
	h := inst.Handle()
	inst.(driver.Detacher).Detach()
	procs := func() []string {
		var out []string
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/space", s.ID))
		for _, dir := range dirs {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			out = append(out, strings.Fields(string(b))...)
		}
		return out
	}
	if len(procs()) == 0 {
		d.DestroyHandle(ctx, h)
		t.Skip("runsc made no cgroup under space/ on this host")
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = delete ] && { echo injected: delete fails >&2; exit 1; }; done\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(s.StateDir)) // newDriver's root
	broken, err := gvisor.New(ctx, gvisor.Config{Runsc: wrapper, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DestroyHandle(context.Background(), h) }) // runsc's own state
	if err := broken.DestroyHandle(ctx, h); err != nil {
		t.Fatalf("destroy with a runsc that cannot delete: %v", err)
	}
	if left := procs(); len(left) > 0 {
		t.Errorf("sandbox processes left: %v", left)
	}
	if _, err := os.Stat(s.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
}
