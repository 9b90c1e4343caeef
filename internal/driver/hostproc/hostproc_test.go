package hostproc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/driver"
)

func TestWaitExit(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Alive(pid) {
		t.Fatal("a running sleep is not alive")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := WaitExit(ctx, pid); err != context.DeadlineExceeded {
		t.Fatalf("WaitExit on a running process: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- WaitExit(t.Context(), pid) }()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie has exited.
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitExit did not return for a killed (zombie) process")
	}
	if Alive(pid) {
		t.Fatal("a zombie counts as alive")
	}
	_ = cmd.Wait()
	if err := WaitExit(t.Context(), pid); err != nil {
		t.Fatalf("WaitExit on a reaped pid: %v", err)
	}
	if Alive(pid) || Alive(0) || Alive(-1) {
		t.Fatal("a gone pid counts as alive")
	}
}

func TestPidAndTail(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "pid")
	if ReadPid(p) != 0 {
		t.Fatal("missing pid file")
	}
	os.WriteFile(p, []byte("1234\n"), 0o600)
	if got := ReadPid(p); got != 1234 {
		t.Fatalf("ReadPid = %d", got)
	}
	os.WriteFile(p, []byte("x"), 0o600)
	if ReadPid(p) != 0 {
		t.Fatal("malformed pid file")
	}
	log := filepath.Join(dir, "log")
	os.WriteFile(log, []byte(strings.Repeat("a", 100)+"the end\n"), 0o600)
	if got := TailFile(log, 8); got != "the end" {
		t.Fatalf("TailFile = %q", got)
	}
	if got := TailFile(filepath.Join(dir, "none"), 8); got != "" {
		t.Fatalf("TailFile of a missing file = %q", got)
	}
}

func TestWaitInstance(t *testing.T) {
	var mu sync.Mutex
	pid, destroyed := 0, false
	state := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		return pid, destroyed
	}
	got := make(chan driver.ExitStatus, 1)
	go func() {
		st, err := WaitInstance(t.Context(), state)
		if err != nil {
			t.Error(err)
		}
		got <- st
	}()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	mu.Lock()
	pid = cmd.Process.Pid // started after Wait was called
	mu.Unlock()
	select {
	case st := <-got:
		t.Fatalf("returned %+v while the process runs", st)
	case <-time.After(300 * time.Millisecond):
	}
	mu.Lock()
	destroyed = true
	mu.Unlock()
	cmd.Process.Kill()
	if st := <-got; st.Reason != "destroyed" {
		t.Fatalf("after destroy: %+v", st)
	}
	if st, err := WaitInstance(t.Context(), func() (int, bool) { return 0, true }); err != nil || st.Reason != "destroyed" {
		t.Fatalf("destroyed before start: %+v %v", st, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := WaitInstance(ctx, func() (int, bool) { return 0, false }); err != context.Canceled {
		t.Fatalf("never started, canceled: %v", err)
	}
}

// TestCapFile: a log appended to without end (a guest's console) is cut to
// its tail once past its bound, and the appender's later writes land after
// it; the cap ends with alive.
func TestCapFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write([]byte(strings.Repeat("x", 100<<10) + "TAIL-OF-THE-LOG"))
	var mu sync.Mutex
	running := true
	done := make(chan struct{})
	go func() {
		CapFile(path, 64<<10, 1<<10, 10*time.Millisecond, func() bool { mu.Lock(); defer mu.Unlock(); return running })
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Cut and its tail written back (the cut truncates first: a
		// write in between lands before the tail, as CapFile says).
		if b, err := os.ReadFile(path); err == nil && len(b) < 4<<10 && strings.HasSuffix(string(b), "TAIL-OF-THE-LOG") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the log was not cut")
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Write([]byte("AFTER"))
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), "TAIL-OF-THE-LOG") || !strings.HasSuffix(string(b), "AFTER") || !strings.Contains(string(b), "console cut") {
		t.Errorf("after the cut: %q", b)
	}
	mu.Lock()
	running = false
	mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("CapFile did not end with alive")
	}
}
