package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLargestProcessDeep: the process a memory reclaim kills is found
// however deep it is nested under the agent: a chain of 80 shells with a
// 200 MiB allocation at its end (a walk cut at 64 levels never saw it and
// killed a smaller, innocent process, or none).
func TestLargestProcessDeep(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "deep.sh")
	ready := filepath.Join(dir, "ready")
	body := `n=$1
if [ "$n" -gt 0 ]; then sh "$0" $((n-1)); exit; fi
exec python3 -c 'import time; x = bytearray(200 << 20); x[::4096] = b"\x01" * len(x[::4096]); open("` + ready + `", "w").close(); time.sleep(60)'
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", script, "80")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// The chain's end is the victim found; kill the whole chain.
		_ = exec.Command("pkill", "-f", script).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the chain's allocation did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := largestProcess(os.Getpid())
	if got.RSS < 150<<20 || !strings.Contains(got.Cmd, "bytearray") {
		t.Fatalf("largest descendant: pid %d, %d MiB, %q; want the python at the chain's end", got.PID, got.RSS>>20, got.Cmd)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(got.PID) + "/status"); err != nil || !strings.Contains(string(b), "python") {
		t.Errorf("pid %d is not the python: %v", got.PID, err)
	}
}
