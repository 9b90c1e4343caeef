package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("cgroup tests write /sys/fs/cgroup and must run as root (make test does)")
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A process started in a sandbox cgroup is in it for every controller,
// with the limits written, the share raised by Prioritize, its memory
// limit enforced (an allocation past it is killed), and the cgroups gone
// after Remove.
func TestStartLimitsAndRemove(t *testing.T) {
	needRoot(t)
	id := fmt.Sprintf("test-cgroup-%d", os.Getpid())
	t.Cleanup(func() { _ = Remove(id) })
	// Waits for a line on stdin, then allocates 256 MiB and touches it.
	cmd := exec.Command("python3", "-c", "import sys; sys.stdin.readline(); b = bytearray(256 << 20); print('survived')")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &strings.Builder{}
	cmd.Stdout = out
	if err := Start(id, cmd, Limits{CPUs: 1, MemoryMB: 64, Pids: 16, Low: true}); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	want := "/" + Parent + "/" + id
	if Unified() {
		if got, err := Of(cmd.Process.Pid, ""); err != nil || got != want {
			t.Fatalf("cgroup = %q %v, want %q", got, err, want)
		}
		d := filepath.Join(Root, Parent, id)
		if got := read(t, filepath.Join(d, "cpu.max")); got != "100000 100000" {
			t.Errorf("cpu.max = %q", got)
		}
		if got := read(t, filepath.Join(d, "memory.max")); got != fmt.Sprint(64<<20) {
			t.Errorf("memory.max = %q", got)
		}
		if got := read(t, filepath.Join(d, "cpu.weight")); got != "1" {
			t.Errorf("pooled cpu.weight = %q", got)
		}
		if err := Prioritize(id); err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(d, "cpu.weight")); got != "100" {
			t.Errorf("cpu.weight after Prioritize = %q", got)
		}
	} else {
		for _, c := range []string{"cpu", "memory", "pids"} {
			if got, err := Of(cmd.Process.Pid, c); err != nil || got != want {
				t.Fatalf("%s cgroup = %q %v, want %q", c, got, err, want)
			}
		}
		if got := read(t, filepath.Join(Root, "cpu", Parent, id, "cpu.cfs_quota_us")); got != "100000" {
			t.Errorf("cpu.cfs_quota_us = %q", got)
		}
		if got := read(t, filepath.Join(Root, "memory", Parent, id, "memory.limit_in_bytes")); got != fmt.Sprint(64<<20) {
			t.Errorf("memory.limit_in_bytes = %q", got)
		}
		if got := read(t, filepath.Join(Root, "pids", Parent, id, "pids.max")); got != "16" {
			t.Errorf("pids.max = %q", got)
		}
		if got := read(t, filepath.Join(Root, "cpu", Parent, id, "cpu.shares")); got != "2" {
			t.Errorf("pooled cpu.shares = %q", got)
		}
		if err := Prioritize(id); err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(Root, "cpu", Parent, id, "cpu.shares")); got != "1024" {
			t.Errorf("cpu.shares after Prioritize = %q", got)
		}
	}
	io.WriteString(stdin, "go\n")
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || strings.Contains(out.String(), "survived") {
		t.Fatalf("256 MiB allocated under a 64 MiB limit: %v, output %q", err, out.String())
	}
	if err := Remove(id); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs(id) {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", d, err)
		}
	}
	if err := Remove(id); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestBadIDs(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "../x", "*", "sb-?", "sb-[a-z]*", `sb\*`} {
		// checkID first: Start or Remove of an accepted glob would make a
		// cgroup named "*" or remove every sandbox's.
		if err := checkID(id); err == nil {
			t.Errorf("checkID(%q) accepted", id)
			continue
		}
		if err := Start(id, exec.Command("true"), Limits{}); err == nil {
			t.Errorf("Start(%q) accepted", id)
		}
		if err := Remove(id); err == nil {
			t.Errorf("Remove(%q) accepted", id)
		}
	}
}

// A process still inside keeps its cgroup: Remove reports it instead of
// hanging, and succeeds once the process is gone.
func TestRemoveBusy(t *testing.T) {
	needRoot(t)
	id := fmt.Sprintf("test-busy-%d", os.Getpid())
	cmd := exec.Command("sleep", "60")
	if err := Start(id, cmd, Limits{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := Remove(id); err == nil {
		t.Error("removed a cgroup with a live process in it")
	}
	if time.Since(start) > 30*time.Second {
		t.Error("Remove of a busy cgroup did not give up")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := Remove(id); err != nil {
		t.Fatal(err)
	}
}

// RemoveOrphans removes an old, empty sandbox cgroup from every hierarchy
// and leaves one that is recent, one with a process and one with a child.
func TestRemoveOrphans(t *testing.T) {
	needRoot(t)
	prefix := fmt.Sprintf("test-orphan-%d-", os.Getpid())
	mine := func(id string) bool { return strings.HasPrefix(id, prefix) }
	old := time.Now().Add(-time.Hour)
	mk := func(name string, backdate bool) {
		t.Helper()
		for _, d := range dirs(prefix + name) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if backdate {
				if err := os.Chtimes(d, old, old); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Cleanup(func() {
			for _, d := range dirs(prefix + name) {
				os.Remove(filepath.Join(d, "child"))
			}
			Remove(prefix + name)
		})
	}
	mk("orphan", true)
	mk("fresh", false)
	mk("child", true)
	for _, d := range dirs(prefix + "child") {
		if err := os.Mkdir(filepath.Join(d, "child"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(d, old, old)
	}
	cmd := exec.Command("sleep", "60")
	if err := Start(prefix+"busy", cmd, Limits{}); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); Remove(prefix + "busy") })
	for _, d := range dirs(prefix + "busy") {
		os.Chtimes(d, old, old)
	}

	got := RemoveOrphans(10*time.Minute, mine)
	if len(got) != 1 || got[0] != prefix+"orphan" {
		t.Errorf("RemoveOrphans = %v, want only %sorphan", got, prefix)
	}
	for name, want := range map[string]bool{"orphan": false, "fresh": true, "child": true, "busy": true} {
		for _, d := range dirs(prefix + name) {
			if _, err := os.Stat(d); (err == nil) != want {
				t.Errorf("%s: exists %v, want %v", d, err == nil, want)
			}
		}
	}
}

// Start runs a process inside its sandbox's cgroups from its first
// instruction, with the limits written before, and leaves none of the
// server's own threads there; a command that cannot start leaves no
// cgroup behind.
func TestStartInsideCgroup(t *testing.T) {
	needRoot(t)
	id := fmt.Sprintf("test-start-%d", os.Getpid())
	t.Cleanup(func() { _ = Remove(id) })
	cmd := exec.Command("sh", "-c", "cat /proc/self/cgroup; read x")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedOut{}
	cmd.Stdout = out
	if err := Start(id, cmd, Limits{CPUs: 1, MemoryMB: 64, Pids: 16}); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	want := "/" + Parent + "/" + id
	waitFor(t, "the child's own view of its cgroup", func() bool { return strings.Count(out.String(), "\n") >= 1 })
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		parts := strings.SplitN(line, ":", 3)
		ctls := strings.Split(parts[1], ",")
		if Unified() || slices.Contains(ctls, "cpu") || slices.Contains(ctls, "memory") || slices.Contains(ctls, "pids") {
			if parts[2] != want {
				t.Errorf("the child started in %q for %q, want %s", parts[2], parts[1], want)
			}
		}
	}
	limit := filepath.Join(Root, "memory", Parent, id, "memory.limit_in_bytes")
	tasks := filepath.Join(Root, "cpu", Parent, id, "tasks")
	if Unified() {
		limit = filepath.Join(Root, Parent, id, "memory.max")
		tasks = filepath.Join(Root, Parent, id, "cgroup.procs")
	}
	if got := read(t, limit); got != fmt.Sprint(64<<20) {
		t.Errorf("memory limit = %q", got)
	}
	waitFor(t, "the forking thread to leave the cgroup", func() bool {
		for _, tid := range strings.Fields(read(t, tasks)) {
			if _, err := os.Stat("/proc/self/task/" + tid); err == nil {
				t.Logf("tasks %q; ours %s", read(t, tasks), tid)
				return false // a thread of this process
			}
		}
		return true
	})
	if !slices.Contains(strings.Fields(read(t, tasks)), fmt.Sprint(cmd.Process.Pid)) {
		t.Errorf("the child %d is not in %s: %q", cmd.Process.Pid, tasks, read(t, tasks))
	}
	io.WriteString(stdin, "\n")
	cmd.Wait()
	if err := Remove(id); err != nil {
		t.Fatal(err)
	}

	bad := exec.Command("/nonexistent/binary")
	if err := Start(id, bad, Limits{Pids: 16}); err == nil {
		t.Fatal("a missing binary started")
	}
	for _, d := range dirs(id) {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left after a failed start: %v", d, err)
		}
	}
}

type lockedOut struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedOut) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedOut) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill ends every process of a sandbox's cgroups, children included, and
// a sandbox with no cgroup has nothing to kill.
func TestKill(t *testing.T) {
	needRoot(t)
	id := fmt.Sprintf("test-kill-%d", os.Getpid())
	t.Cleanup(func() { _ = Remove(id) })
	cmd := exec.Command("sh", "-c", "sleep 600 & sleep 600; wait")
	if err := Start(id, cmd, Limits{Pids: 16}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, "the shell's children", func() bool {
		b, _ := os.ReadFile(filepath.Join(dirs(id)[0], "cgroup.procs"))
		return len(strings.Fields(string(b))) >= 3
	})
	n, err := Kill(id)
	if err != nil || n < 3 {
		t.Fatalf("Kill: %d, %v", n, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the shell outlived Kill")
	}
	if err := Remove(id); err != nil {
		t.Fatalf("cgroup busy after Kill: %v", err)
	}
	if n, err := Kill(id); n != 0 || err != nil {
		t.Errorf("Kill without cgroups: %d, %v", n, err)
	}
}
