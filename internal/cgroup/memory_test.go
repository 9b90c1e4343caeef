package cgroup

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// WatchMemory calls back once the usage reaches the threshold (the kernel
// signals the crossing), and SetMemoryLimit moves the hard limit both ways.
func TestWatchMemoryAndSetLimit(t *testing.T) {
	needRoot(t)
	if Unified() {
		t.Skip("memory watch is cgroup v1 only (see ErrNoMemoryWatch); this host runs v2")
	}
	id := fmt.Sprintf("test-memwatch-%d", os.Getpid())
	t.Cleanup(func() { _ = Remove(id) })
	// Writes 128 MiB to a file (page cache, which must not count), then
	// waits for a line on stdin, allocates 96 MiB, touches it and waits.
	file := filepath.Join(t.TempDir(), "big")
	cmd := exec.Command("python3", "-c", "import sys, time\nwith open(sys.argv[1], 'wb') as f:\n    [f.write(b'z' * (1 << 20)) for i in range(128)]\nprint('written', flush=True)\nsys.stdin.readline(); b = b'x' * (96 << 20); time.sleep(30)", file)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := Place(id, cmd.Process.Pid, Limits{MemoryMB: 256}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(Root, "memory", Parent, id)
	for _, mb := range []int64{384, 200} { // raise, then lower below the start
		if err := SetMemoryLimit(id, mb<<20); err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(d, "memory.limit_in_bytes")); got != strconv.FormatInt(mb<<20, 10) {
			t.Fatalf("limit after SetMemoryLimit(%d MiB) = %s", mb, got)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fired := make(chan int64, 16)
	if err := WatchMemory(ctx, id, 64<<20, func(u int64) {
		select {
		case fired <- u:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "written\n" {
		t.Fatalf("writer: %q %v", line, err)
	}
	if u, _ := MemoryUsage(id); u < 64<<20 {
		t.Logf("usage after writing the file only %d bytes (page cache written back?)", u)
	}
	select {
	case u := <-fired:
		t.Fatalf("fired at a working set of %d bytes for page cache", u)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-fired:
		if u < 64<<20 {
			t.Fatalf("fired at %d bytes, below the threshold", u)
		}
		if got, err := MemoryUsage(id); err != nil || got < 64<<20 {
			t.Fatalf("MemoryUsage = %d %v", got, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no callback after the process allocated past the threshold")
	}
	// A watch registered while the working set is already past its
	// threshold (a recovered sandbox) fires too, with no crossing.
	late := make(chan int64, 16)
	if err := WatchMemory(ctx, id, 64<<20, func(u int64) {
		select {
		case late <- u:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-late:
	case <-time.After(10 * time.Second):
		t.Fatal("no callback for a watch registered above its threshold")
	}
}
