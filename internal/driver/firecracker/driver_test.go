package firecracker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
)

// fakeEnvFor makes the test binary the firecracker and jailer test
// doubles for this test (TestMain) and returns their paths and the
// directory of their call logs.
func fakeEnvFor(t *testing.T) (fc, jailer, logDir string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fc, jailer = filepath.Join(dir, "firecracker"), filepath.Join(dir, "jailer")
	for _, p := range []string{fc, jailer} {
		if err := os.Symlink(exe, p); err != nil {
			t.Fatal(err)
		}
	}
	logDir = t.TempDir()
	t.Setenv(fakeEnv, logDir)
	return fc, jailer, logDir
}

// fakeSetup is a driver whose firecracker (and jailer) are the test
// doubles, with a stand-in kernel and initramfs, and specs for it.
type fakeSetup struct {
	d      *Driver
	logDir string
	files  string // stand-in kernel, initramfs, template image, agent
	states string
}

func newFakeSetup(t *testing.T, jailed bool) *fakeSetup {
	t.Helper()
	if jailed && os.Geteuid() != 0 {
		t.Skip("the jailed layout chowns files to the VM's uid: needs root")
	}
	fc, jailer, logDir := fakeEnvFor(t)
	s := &fakeSetup{logDir: logDir, files: t.TempDir()}
	// A deep state directory: the jail's sockets do not fit sun_path.
	s.states = filepath.Join(t.TempDir(), "var-lib-space-sandboxes-with-a-long-name")
	for name, size := range map[string]int64{"vmlinux": 1 << 20, "initrd.cpio": 1 << 20, "base.ext4": 64 << 20, "space-agent": 1 << 10} {
		f, err := os.OpenFile(filepath.Join(s.files, name), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(name) // sparse beyond the name
		f.Truncate(size)
		f.Close()
	}
	s.d = newDriver(Config{Firecracker: fc, Jailer: jailer, NoJailer: !jailed, CacheDir: t.TempDir(), Log: slog.Default()},
		fakeVersion, filepath.Join(s.files, "vmlinux"), "")
	s.d.initrd = func(context.Context, string) (string, error) { return filepath.Join(s.files, "initrd.cpio"), nil }
	return s
}

func (s *fakeSetup) spec() driver.Spec {
	b := make([]byte, 8)
	rand.Read(b)
	id := "sb-fake-" + hex.EncodeToString(b)
	return driver.Spec{ID: id, Hostname: "sandbox", Rootfs: filepath.Join(s.files, "base.ext4"), RootfsKind: "raw",
		StateDir: filepath.Join(s.states, id), AgentPath: filepath.Join(s.files, "space-agent"), VCPU: 2, MemoryMB: 256}
}

// echo checks that DialAgent reaches the (fake) guest's agent port.
func echo(t *testing.T, inst driver.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := inst.DialAgent(ctx)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("agent echo %q, %v", b, err)
	}
}

func pidOf(t *testing.T, inst driver.Instance) int {
	t.Helper()
	pid := inst.(*Instance).pid
	if pid <= 0 {
		t.Fatal("no pid")
	}
	return pid
}

// TestFakeLifecycle drives whole instances through the driver against the
// test-double processes, under the jailer and without it: create, start,
// agent, pause/resume, checkpoint of a paused and of a running VM, restore
// into a new instance, recovery by a fresh driver, destroy. The fake
// process checks every API call (fakevmm_test.go); the recorded order is
// compared with the documented sequence.
func TestFakeLifecycle(t *testing.T) {
	for _, jailed := range []bool{true, false} {
		name := map[bool]string{true: "Jailed", false: "Direct"}[jailed]
		t.Run(name, func(t *testing.T) { testFakeLifecycle(t, jailed) })
	}
}

func testFakeLifecycle(t *testing.T, jailed bool) {
	s := newFakeSetup(t, jailed)
	ctx := t.Context()
	spec := s.spec()
	inst, err := s.d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { inst.Destroy(context.Background()) })
	fi := inst.(*Instance)
	if len(fi.vsockPath()) <= maxSunPath {
		t.Errorf("test layout too shallow to exercise long socket paths: %s", fi.vsockPath())
	}
	disk, err := os.Stat(filepath.Join(fi.root, diskName))
	if err != nil || disk.Mode().Perm() != 0o600 || disk.Size() != 64<<20 {
		t.Fatalf("disk: %v %v", disk, err)
	}
	if jailed {
		if st := disk.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("disk owned by %d:%d, want the VM's 65534:65534", st.Uid, st.Gid)
		}
		if want := filepath.Join(spec.StateDir, "firecracker", spec.ID, "root"); fi.root != want {
			t.Errorf("jail root %s, want %s", fi.root, want)
		}
	}
	if err := inst.Pause(ctx); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Pause before Start: %v", err)
	}
	if err := inst.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := inst.Start(ctx); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Start: %v", err)
	}
	pid := pidOf(t, inst)
	echo(t, inst)
	// The VM runs in its own cgroup under space/, with its limits (the
	// jailer's --cgroup, or moved there without the jailer).
	if os.Geteuid() == 0 && !cgroup.Unified() {
		if got, err := cgroup.Of(pid, "cpu"); err != nil || got != "/space/"+spec.ID {
			t.Errorf("firecracker's cpu cgroup %q %v", got, err)
		}
		if got, err := cgroup.Of(pid, "memory"); err != nil || got != "/space/"+spec.ID {
			t.Errorf("firecracker's memory cgroup %q %v", got, err)
		}
		q, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu/space", spec.ID, "cpu.cfs_quota_us"))
		if strings.TrimSpace(string(q)) != "200000" {
			t.Errorf("cpu quota %q, want 2 vCPUs", q)
		}
		if err := inst.(driver.Prioritizer).Prioritize(ctx); err != nil {
			t.Errorf("Prioritize: %v", err)
		}
	}
	for _, step := range []func(context.Context) error{inst.Pause, inst.Pause, inst.Resume, inst.Resume, inst.Pause} {
		if err := step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Checkpoint of a paused VM: it stays paused.
	ck := inst.(driver.Checkpointer)
	img := filepath.Join(t.TempDir(), "image")
	if err := ck.Checkpoint(ctx, img, true); err != nil {
		t.Fatalf("Checkpoint (paused): %v", err)
	}
	for _, f := range []string{ckptState, ckptMemory, ckptDisk, ckptMachine} {
		if _, err := os.Stat(filepath.Join(img, f)); err != nil {
			t.Errorf("checkpoint image: %v", err)
		}
	}
	if info, _ := fi.api().info(ctx); info.State != statePaused {
		t.Errorf("after checkpoint of a paused VM: %q", info.State)
	}
	if err := inst.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// Checkpoint of a running VM: paused for the snapshot, then resumed.
	img2 := filepath.Join(t.TempDir(), "image")
	if err := ck.Checkpoint(ctx, img2, true); err != nil {
		t.Fatalf("Checkpoint (running): %v", err)
	}
	if info, _ := fi.api().info(ctx); info.State != stateRunning {
		t.Errorf("after checkpoint of a running VM: %q", info.State)
	}
	echo(t, inst)

	// Restore two children from the first image; the image may go away.
	var kids []driver.Instance
	for range 2 {
		kspec := s.spec()
		kid, err := s.d.Restore(ctx, kspec, img)
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		t.Cleanup(func() { kid.Destroy(context.Background()) })
		kids = append(kids, kid)
	}
	os.RemoveAll(img)
	for _, kid := range kids {
		echo(t, kid)
		if info, _ := kid.(*Instance).api().info(ctx); info.State != stateRunning {
			t.Errorf("restored VM state %q", info.State)
		}
	}

	// A restarted server re-attaches from the handle.
	h := inst.Handle()
	inst.(driver.Detacher).Detach()
	d2 := newDriver(s.d.cfg, fakeVersion, s.d.kernel, "")
	again, err := d2.Recover(ctx, h)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	echo(t, again)

	// Wait returns once destroyed.
	waited := make(chan driver.ExitStatus, 1)
	go func() {
		st, _ := again.Wait(context.Background())
		waited <- st
	}()
	select {
	case st := <-waited:
		t.Fatalf("Wait returned while running: %+v", st)
	case <-time.After(100 * time.Millisecond):
	}
	for k := range 2 {
		if err := again.Destroy(ctx); err != nil {
			t.Fatalf("Destroy #%d: %v", k+1, err)
		}
	}
	select {
	case st := <-waited:
		if st.Reason != "destroyed" {
			t.Errorf("Wait: %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Destroy")
	}
	if hostproc.Alive(pid) {
		t.Errorf("firecracker %d alive after Destroy", pid)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu/space", spec.ID)); !os.IsNotExist(err) {
		t.Errorf("cgroup left after Destroy: %v", err)
	}
	if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	if _, err := d2.Recover(ctx, h); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Recover after Destroy: %v", err)
	}

	want := []string{
		"PUT /boot-source", "PUT /drives/rootfs", "PUT /machine-config", "PUT /vsock", "PUT /actions InstanceStart",
		"PATCH /vm Paused", "PATCH /vm Paused", "PATCH /vm Resumed", "PATCH /vm Resumed", "PATCH /vm Paused",
		"PUT /snapshot/create Full", // the paused VM: no pause, no resume
		"PATCH /vm Resumed",
		"PATCH /vm Paused", "PUT /snapshot/create Full", "PATCH /vm Resumed", // the running VM
	}
	calls := readCalls(t, s.logDir, spec.ID)
	if got := callNames(calls); !slices.Equal(got, want) {
		t.Errorf("parent's API calls\n got %q\nwant %q", got, want)
	}
	for _, kid := range kids {
		kc := readCalls(t, s.logDir, kid.ID())
		if got := callNames(kc); !slices.Equal(got, []string{"PUT /snapshot/load"}) {
			t.Errorf("child's API calls %q", got)
		}
		calls = append(calls, kc...)
	}
	for _, c := range calls {
		if c.Status/100 != 2 {
			t.Errorf("%s refused: %d %s", c, c.Status, c.Fault)
		}
		// Every path is relative to the VM's root: a snapshot taken here
		// must find the child's own files, never the parent's.
		var body map[string]any
		json.Unmarshal(c.Body, &body)
		if mb, ok := body["mem_backend"].(map[string]any); ok {
			body["backend_path"] = mb["backend_path"]
		}
		for _, k := range []string{"kernel_image_path", "initrd_path", "path_on_host", "uds_path", "snapshot_path", "mem_file_path", "backend_path"} {
			if p, ok := body[k].(string); ok && filepath.IsAbs(p) {
				t.Errorf("%s: %s %q is absolute", c, k, p)
			}
		}
	}
}

// TestFakeStartFails: an InstanceStart refused by Firecracker surfaces its
// fault message, kills the process and removes the jail; Destroy removes
// the rest.
func TestFakeStartFails(t *testing.T) {
	for _, jailed := range []bool{true, false} {
		name := map[bool]string{true: "Jailed", false: "Direct"}[jailed]
		t.Run(name, func(t *testing.T) {
			s := newFakeSetup(t, jailed)
			t.Setenv(fakeFailEnv, actionInstanceStart)
			spec := s.spec()
			inst, err := s.d.Create(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { inst.Destroy(context.Background()) })
			err = inst.Start(t.Context())
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Path != "/actions" ||
				!strings.Contains(err.Error(), "injected failure of InstanceStart") {
				t.Fatalf("Start: %v", err)
			}
			fi := inst.(*Instance)
			if fi.pid <= 0 || hostproc.Alive(fi.pid) {
				t.Errorf("firecracker (pid %d) not killed", fi.pid)
			}
			if _, err := os.Stat(s.d.jailDir(spec.StateDir, spec.ID)); !os.IsNotExist(err) {
				t.Errorf("jail left after a failed start: %v", err)
			}
			if err := inst.Destroy(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
				t.Errorf("state dir left: %v", err)
			}
		})
	}
}

// TestFakeCreateRollsBack: a Create that fails half-way leaves nothing.
func TestFakeCreateRollsBack(t *testing.T) {
	s := newFakeSetup(t, false)
	s.d.initrd = func(context.Context, string) (string, error) { return "", errdefs.Unavailable("no initramfs") }
	spec := s.spec()
	if _, err := s.d.Create(t.Context(), spec); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Create: %v", err)
	}
	if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
}

// TestFakeRestoreFails: a snapshot Firecracker cannot load leaves no
// instance behind.
func TestFakeRestoreFails(t *testing.T) {
	s := newFakeSetup(t, false)
	img := t.TempDir()
	for _, f := range []string{ckptState, ckptMemory, ckptDisk} {
		os.WriteFile(filepath.Join(img, f), []byte("garbage"), 0o600)
	}
	writeJSON(filepath.Join(img, ckptMachine), machine{VCPU: 1, MemoryMB: 128})
	spec := s.spec()
	_, err := s.d.Restore(t.Context(), spec, img)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Path != "/snapshot/load" || !strings.Contains(apiErr.Fault, "bad state file") {
		t.Fatalf("Restore: %v", err)
	}
	if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	if _, err := s.d.Restore(t.Context(), s.spec(), t.TempDir()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Restore from a non-image: %v", err)
	}
}

// TestFakeDialAgentProcessGone: DialAgent gives up as soon as the VM's
// process is gone instead of waiting out its context.
func TestFakeDialAgentProcessGone(t *testing.T) {
	s := newFakeSetup(t, false)
	inst, err := s.d.Create(t.Context(), s.spec())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Destroy(context.Background()) })
	if err := inst.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pidOf(t, inst), syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := inst.DialAgent(ctx); !errors.Is(err, errdefs.ErrUnavailable) || time.Since(start) > 5*time.Second {
		t.Errorf("DialAgent to a dead VM: %v after %s", err, time.Since(start))
	}
	st, err := inst.Wait(ctx)
	if err != nil || st.Reason != "exited" {
		t.Errorf("Wait: %+v %v", st, err)
	}
}

var _ net.Conn = (*bufConn)(nil)
