package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/driver"
)

type snapshotView struct {
	ID         string    `json:"id"`
	SandboxID  string    `json:"sandbox_id"`
	Kind       string    `json:"kind"`
	Name       string    `json:"name"`
	Status     string    `json:"status"`
	Parent     string    `json:"parent"`
	Automatic  bool      `json:"automatic"`
	BytesNew   int64     `json:"bytes_new"`
	BytesTotal int64     `json:"bytes_total"`
	CreatedAt  time.Time `json:"created_at"`
	Verified   bool      `json:"verified"`
	CommandID  int64     `json:"command_id"`
	Cause      string    `json:"cause"`
}

func (s *server) snapshot(id, kind, name string) snapshotView {
	s.t.Helper()
	var sn snapshotView
	if code := s.do("POST", "/v1/sandboxes/"+id+"/snapshots", s.key, map[string]string{"kind": kind, "name": name}, &sn); code != 201 || sn.Status != "ready" {
		s.t.Fatalf("snapshot %s: %d %+v", kind, code, sn)
	}
	return sn
}

// counterScript keeps a counter only in memory and publishes it every
// 50 ms to /tmp/counter (atomically: a reader never sees a half-written
// file).
const counterScript = `import time,os
n=0
while True:
    n+=1
    open('/tmp/counter.tmp','w').write(str(n))
    os.replace('/tmp/counter.tmp','/tmp/counter')
    time.sleep(0.05)
`

// startCounter runs counterScript in the background in sandbox id (after
// ending any counter a previous test left in a shared sandbox) and returns
// its pid once it has published a first value. It is killed when t ends.
func startCounter(t *testing.T, s *server, id string) int {
	t.Helper()
	// The pattern does not match the shell running pkill itself.
	s.sh(id, "pkill -KILL -f 'counter[.]tmp'; rm -f /tmp/counter")
	var bg struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"python3", "-c", counterScript}, "background": true}, &bg); code != 202 {
		t.Fatalf("start counter: %d", code)
	}
	waitFor(t, "counter to start", 20*time.Second, func() bool { return s.sh(id, "test -s /tmp/counter && echo y").Stdout == "y\n" })
	t.Cleanup(func() {
		s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, bg.PID), s.key, map[string]string{"signal": "SIGKILL"}, nil)
	})
	return bg.PID
}

func readCounter(t *testing.T, s *server, id string) int {
	t.Helper()
	r := s.sh(id, "cat /tmp/counter")
	n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		t.Fatalf("counter %q: %v", r.Stdout, err)
	}
	return n
}

func TestPauseResume(t *testing.T) { forEachDriver(t, testPauseResume) }

func testPauseResume(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	pid := startCounter(t, s, id)
	s.put(id, "/home/user/open.txt", strings.NewReader("kept across pause"))

	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, &sb); code != 200 || sb.State != "paused" {
		t.Fatalf("pause: %d %+v", code, sb)
	}
	var e apiError
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, &e); code != 409 || e.State != "paused" {
		t.Errorf("pause a paused sandbox: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "true"}, &e); code != 409 || e.State != "paused" {
		t.Errorf("exec while paused: %d %+v", code, e)
	}
	// The checkpoint-on-pause is in the timeline.
	var tl struct{ Snapshots []snapshotView }
	s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl)
	if len(tl.Snapshots) == 0 || tl.Snapshots[len(tl.Snapshots)-1].Kind != "checkpoint" || !tl.Snapshots[len(tl.Snapshots)-1].Automatic {
		t.Errorf("no automatic checkpoint on pause: %+v", tl.Snapshots)
	}
	time.Sleep(time.Second) // the interval under test: a running counter would advance ~20 times
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("resume: %d %+v", code, sb)
	}
	after := readCounter(t, s, id)
	// Read the counter the paused process had written last from the
	// checkpoint-free side: compare two reads right after resume.
	time.Sleep(300 * time.Millisecond)
	later := readCounter(t, s, id)
	if later <= after {
		t.Errorf("counter stuck after resume: %d then %d", after, later)
	}
	// The same process (same pid) is still running: its memory survived.
	var ps struct {
		Processes []struct {
			PID     int  `json:"pid"`
			Running bool `json:"running"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+id+"/processes", s.key, nil, &ps)
	alive := false
	for _, p := range ps.Processes {
		alive = alive || (p.PID == pid && p.Running)
	}
	if !alive {
		t.Errorf("process %d not running after resume", pid)
	}
	if r := s.sh(id, "cat /home/user/open.txt"); r.Stdout != "kept across pause" {
		t.Errorf("file after resume: %q", r.Stdout)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &e); code != 409 || e.State != "running" {
		t.Errorf("resume a running sandbox: %d %+v", code, e)
	}
}

// TestPausedMakesNoProgress: a counting process gains nothing while its
// sandbox is paused for a second. Its pace is measured first (a VM under
// TCG counts slower than the script's nominal 20 per second).
func TestPausedMakesNoProgress(t *testing.T) { forEachDriver(t, testPausedMakesNoProgress) }

func testPausedMakesNoProgress(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	startCounter(t, s, id)
	c0, t0 := readCounter(t, s, id), time.Now()
	time.Sleep(time.Second)
	c1, t1 := readCounter(t, s, id), time.Now()
	rate := float64(c1-c0) / t1.Sub(t0).Seconds()
	if rate <= 0 {
		t.Fatalf("counter not advancing: %d then %d", c0, c1)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	time.Sleep(time.Second) // paused span: ~rate increments if it kept running
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, nil); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	c2 := readCounter(t, s, id)
	wall := time.Since(t1)
	// Had it kept running it would have gained rate*wall; the paused
	// second must be missing from that (allowing half of it for timer
	// slack on a loaded machine).
	ifRunning := rate * wall.Seconds()
	if float64(c2-c1) > ifRunning-rate/2 {
		t.Errorf("counter advanced by %d in %v with a 1 s pause (%.0f if never paused, %.1f/s)", c2-c1, wall, ifRunning, rate)
	}
	t.Logf("counter advanced by %d in %v with a 1 s pause (%.0f if never paused, %.1f/s)", c2-c1, wall, ifRunning, rate)
}

func TestCheckpointDestroyRestore(t *testing.T) { forEachDriver(t, testCheckpointDestroyRestore) }

func testCheckpointDestroyRestore(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.createOn(t, drv, nil)
	payload := bytes.Repeat([]byte("checkpointed bytes\x00\x01\xff"), 50000)
	s.put(id, "/home/user/data.bin", bytes.NewReader(payload))
	pid := startCounter(t, s, id)
	sn := s.snapshot(id, "checkpoint", "before-cleanup")
	if sn.Kind != "checkpoint" || sn.Name != "before-cleanup" || sn.BytesTotal <= 0 {
		t.Fatalf("snapshot: %+v", sn)
	}
	at := readCounter(t, s, id)
	s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)

	var nb sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"snapshot": sn.ID}, &nb); code != 201 || nb.State != "running" || nb.ID == id || nb.Driver != drv {
		t.Fatalf("create from snapshot: %d %+v", code, nb)
	}
	t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+nb.ID, s.key, nil, nil) })
	resp, err := s.get(nb.ID, "/home/user/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, payload) {
		t.Errorf("file after restore: %d bytes, want %d identical", len(got), len(payload))
	}
	// The counter process came back with its memory: it continues from
	// about where it was, not from 1.
	waitFor(t, "restored counter to advance", 10*time.Second, func() bool { return readCounter(t, s, nb.ID) > at })
	var ps struct {
		Processes []struct {
			PID     int  `json:"pid"`
			Running bool `json:"running"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+nb.ID+"/processes", s.key, nil, &ps)
	found := false
	for _, p := range ps.Processes {
		found = found || (p.PID == pid && p.Running)
	}
	if !found {
		t.Errorf("process %d not in the restored sandbox: %+v", pid, ps)
	}
	var v snapshotView
	if code := s.do("GET", "/v1/snapshots/"+sn.ID+"?verify=true", s.key, nil, &v); code != 200 || !v.Verified {
		t.Errorf("verify: %d %+v", code, v)
	}
}

func TestFork(t *testing.T) { forEachDriver(t, testFork) }

func testFork(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.createOn(t, drv, nil)
	s.put(id, "/home/user/shared.txt", strings.NewReader("from parent"))
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "export SECRET_STATE=42; sleep 1000", "background": true}, nil)
	var out struct{ Sandboxes []sandboxView }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/fork", s.key, map[string]int{"count": 3}, &out); code != 201 || len(out.Sandboxes) != 3 {
		t.Fatalf("fork: %d %+v", code, out)
	}
	ids := []string{id}
	for _, k := range out.Sandboxes {
		t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+k.ID, s.key, nil, nil) })
	}
	for _, k := range out.Sandboxes {
		if k.State != "running" || k.ID == id || k.Driver != drv {
			t.Fatalf("child %+v", k)
		}
		ids = append(ids, k.ID)
	}
	for i, x := range ids {
		if r := s.sh(x, "cat /home/user/shared.txt"); r.Stdout != "from parent" {
			t.Errorf("sandbox %d sees %q", i, r.Stdout)
		}
		s.put(x, "/home/user/own.txt", strings.NewReader(fmt.Sprintf("copy %d", i)))
	}
	for i, x := range ids {
		if r := s.sh(x, "cat /home/user/own.txt"); r.Stdout != fmt.Sprintf("copy %d", i) {
			t.Errorf("sandbox %d: own file %q (writes leaked between copies)", i, r.Stdout)
		}
		// Processes came along.
		if r := s.sh(x, "pgrep -c sleep"); strings.TrimSpace(r.Stdout) != "1" {
			t.Errorf("sandbox %d: sleep processes %q", i, r.Stdout)
		}
	}
	// Entropy differs between children.
	a := s.sh(out.Sandboxes[0].ID, "head -c 16 /dev/urandom | od -An -tx1").Stdout
	b := s.sh(out.Sandboxes[1].ID, "head -c 16 /dev/urandom | od -An -tx1").Stdout
	if a == b {
		t.Errorf("children share random state: %q", a)
	}
	var e apiError
	s.do("DELETE", "/v1/sandboxes/"+ids[3], s.key, nil, nil)
	if code := s.do("POST", "/v1/sandboxes/"+ids[3]+"/fork", s.key, map[string]int{"count": 1}, &e); code != 409 || e.State != "stopped" {
		t.Errorf("fork a stopped sandbox: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/fork", s.key, map[string]int{"count": 100}, &e); code != 400 {
		t.Errorf("fork 100: %d", code)
	}
}

func TestTimeTravel(t *testing.T) { forEachDriver(t, testTimeTravel) }

func testTimeTravel(t *testing.T, drv string) {
	s := sharedServer(t)
	if !capable(drv, driver.CapFilesSnapshot) {
		fileViewsRefused(t, s, drv)
		return
	}
	id := s.createOn(t, drv, nil)
	s.put(id, "/home/user/report.csv", strings.NewReader("v1\n"))
	s.put(id, "/home/user/notes.txt", strings.NewReader("notes"))
	s.put(id, "/home/user/other.txt", strings.NewReader("other v1"))
	a := s.snapshot(id, "files", "")
	s.put(id, "/home/user/report.csv", strings.NewReader("v2 with more\n"))
	s.put(id, "/home/user/other.txt", strings.NewReader("other v2"))
	s.sh(id, "rm /home/user/notes.txt")
	b := s.snapshot(id, "files", "")
	if b.Parent != a.ID {
		t.Errorf("lineage: %s's parent is %q, want %s", b.ID, b.Parent, a.ID)
	}
	var diff struct {
		Changes []struct {
			Path    string `json:"path"`
			Kind    string `json:"kind"`
			OldSize int64  `json:"old_size"`
			NewSize int64  `json:"new_size"`
		}
	}
	if code := s.do("GET", "/v1/snapshots/diff?from="+a.ID+"&to="+b.ID, s.key, nil, &diff); code != 200 {
		t.Fatalf("diff: %d", code)
	}
	got := map[string]string{}
	for _, c := range diff.Changes {
		got[c.Path] = c.Kind
		if c.Path == "/home/user/report.csv" && (c.OldSize != 3 || c.NewSize != 13) {
			t.Errorf("report.csv sizes %d → %d", c.OldSize, c.NewSize)
		}
	}
	if got["/home/user/report.csv"] != "modified" || got["/home/user/notes.txt"] != "removed" || got["/home/user/other.txt"] != "modified" {
		t.Errorf("diff: %+v", diff.Changes)
	}
	// Read one file from the past and list a directory.
	resp, _ := http.NewRequest("GET", s.url+"/v1/snapshots/"+a.ID+"/files?path=/home/user/report.csv", nil)
	resp.Header.Set("Authorization", "Bearer "+s.key)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if string(old) != "v1\n" {
		t.Errorf("file from snapshot a: %q", old)
	}
	var ls struct{ Entries []struct{ Path, Type string } }
	s.do("GET", "/v1/snapshots/"+a.ID+"/files?path=/home/user", s.key, nil, &ls)
	names := ""
	for _, e := range ls.Entries {
		names += e.Path + " "
	}
	if !strings.Contains(names, "/home/user/notes.txt") || !strings.Contains(names, "/home/user/report.csv") {
		t.Errorf("listing of snapshot a: %s", names)
	}
	// Restore one path: report.csv is v1 again, other.txt stays v2 and
	// notes.txt stays deleted.
	var res struct{ Written, Removed []string }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": a.ID, "paths": []string{"/home/user/report.csv"}}, &res); code != 200 {
		t.Fatalf("restore: %d", code)
	}
	if r := s.sh(id, "cat /home/user/report.csv; cat /home/user/other.txt; test -e /home/user/notes.txt && echo notes-back"); r.Stdout != "v1\nother v2" {
		t.Errorf("after restoring one path: %q (written %v)", r.Stdout, res.Written)
	}
	// Whole restore: everything back to a.
	s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": a.ID}, &res)
	if r := s.sh(id, "cat /home/user/report.csv /home/user/other.txt /home/user/notes.txt"); r.Stdout != "v1\nother v1notes" {
		t.Errorf("after whole restore: %q", r.Stdout)
	}
}

func TestSnapshotDedup(t *testing.T) { forEachDriver(t, testSnapshotDedup) }

func testSnapshotDedup(t *testing.T, drv string) {
	s := sharedServer(t)
	if !capable(drv, driver.CapFilesSnapshot) {
		filesSnapshotRefused(t, s, drv)
		// The last test on the shared VM: it need not idle through the
		// rest of the suite.
		s.releaseSharedVM()
		return
	}
	id := s.createOn(t, drv, map[string]any{"memory_mb": 1024})
	// A 200 MB workspace of incompressible data.
	if r := s.sh(id, "mkdir -p /home/user/ws && for i in 1 2 3 4; do head -c 50000000 /dev/urandom > /home/user/ws/part$i; done && du -sm /home/user/ws"); !strings.HasPrefix(r.Stdout, "19") && !strings.HasPrefix(r.Stdout, "20") {
		t.Fatalf("workspace: %+v", r)
	}
	first := s.snapshot(id, "files", "")
	second := s.snapshot(id, "files", "")
	if first.BytesTotal < 200e6 || second.BytesTotal < 200e6 {
		t.Fatalf("bytes_total %d, %d", first.BytesTotal, second.BytesTotal)
	}
	if float64(second.BytesNew) > 0.01*float64(second.BytesTotal) {
		t.Errorf("second snapshot of an unchanged workspace stored %d new bytes of %d (>1%%)", second.BytesNew, second.BytesTotal)
	}
	// A second sandbox of the same template: its snapshot shares the
	// template's chunks and costs only its own small changes.
	other := s.createOn(t, drv, nil)
	s.put(other, "/home/user/small.txt", strings.NewReader("tiny"))
	o := s.snapshot(other, "files", "")
	if o.BytesNew > 1<<20 {
		t.Errorf("snapshot of a fresh sandbox stored %d new bytes", o.BytesNew)
	}
	t.Logf("200 MB workspace: first %d new bytes, second %d new of %d; fresh sandbox %d", first.BytesNew, second.BytesNew, second.BytesTotal, o.BytesNew)
}

func TestSnapshotCrashSafety(t *testing.T) {
	s := startServer(t, "", "--pool-size", "-1")
	id := s.create(map[string]any{"memory_mb": 1024})
	s.put(id, "/home/user/a.txt", strings.NewReader("early"))
	early := s.snapshot(id, "files", "early")
	s.sh(id, "head -c 300000000 /dev/urandom > /home/user/big.bin")
	// Start a big snapshot and kill the server in the middle of it.
	go func() {
		req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+id+"/snapshots", strings.NewReader(`{"kind":"files"}`))
		req.Header.Set("Authorization", "Bearer "+s.key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the snapshot to start", 10*time.Second, func() bool {
		var tl struct{ Snapshots []snapshotView }
		s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl)
		return len(tl.Snapshots) == 2
	})
	time.Sleep(300 * time.Millisecond)
	s.kill9()
	s.start()
	var tl struct{ Snapshots []snapshotView }
	s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl)
	for _, sn := range tl.Snapshots {
		if sn.ID != early.ID && sn.Status == "ready" {
			t.Logf("the big snapshot finished before the kill; crash window missed")
		}
		if sn.ID != early.ID && sn.Status != "ready" && sn.Status != "failed" {
			t.Errorf("partial snapshot %s is %s after restart", sn.ID, sn.Status)
		}
	}
	var v snapshotView
	if code := s.do("GET", "/v1/snapshots/"+early.ID+"?verify=true", s.key, nil, &v); code != 200 || !v.Verified {
		t.Errorf("earlier snapshot after crash: %d %+v", code, v)
	}
	resp, _ := http.NewRequest("GET", s.url+"/v1/snapshots/"+early.ID+"/files?path=/home/user/a.txt", nil)
	resp.Header.Set("Authorization", "Bearer "+s.key)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if string(b) != "early" {
		t.Errorf("file from the earlier snapshot: %q", b)
	}
}

// filesSnapshotRefused: on a driver without file-level snapshots a files
// snapshot is a clear 501 that leaves nothing in the timeline.
func filesSnapshotRefused(t *testing.T, s *server, drv string) {
	id := s.sharedSandbox(t, drv)
	var e apiError
	code := s.do("POST", "/v1/sandboxes/"+id+"/snapshots", s.key, map[string]string{"kind": "files"}, &e)
	notSupported(t, "files snapshot", code, e, drv)
	var tl struct{ Snapshots []snapshotView }
	s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl)
	for _, sn := range tl.Snapshots {
		if sn.Kind == "files" {
			t.Errorf("refused files snapshot left a record: %+v", sn)
		}
	}
}

// fileViewsRefused: on a driver without file-level snapshots, its
// checkpoints restore and fork but have no file view: reading a path of
// one, diffing it and restoring paths from it into the sandbox are clear
// 501s, and the sandbox is untouched.
func fileViewsRefused(t *testing.T, s *server, drv string) {
	filesSnapshotRefused(t, s, drv)
	id := s.sharedSandbox(t, drv)
	s.put(id, "/home/user/report.csv", strings.NewReader("v1\n"))
	// A checkpoint already in the timeline (a pause takes one) will do.
	var tl struct{ Snapshots []snapshotView }
	s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl)
	var cp snapshotView
	for _, sn := range tl.Snapshots {
		if sn.Kind == "checkpoint" && sn.Status == "ready" {
			cp = sn
		}
	}
	if cp.ID == "" {
		cp = s.snapshot(id, "checkpoint", "")
	}
	var e apiError
	code := s.do("GET", "/v1/snapshots/"+cp.ID+"/files?path=/home/user", s.key, nil, &e)
	notSupported(t, "listing a checkpoint's files", code, e, drv)
	e = apiError{}
	code = s.do("GET", "/v1/snapshots/diff?from="+cp.ID+"&to="+cp.ID, s.key, nil, &e)
	notSupported(t, "diff of checkpoints", code, e, drv)
	e = apiError{}
	code = s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": cp.ID, "paths": []string{"/home/user/report.csv"}}, &e)
	notSupported(t, "restoring paths", code, e, drv)
	if r := s.sh(id, "cat /home/user/report.csv"); r.Stdout != "v1\n" {
		t.Errorf("sandbox after a refused restore: %+v", r)
	}
}

// A gVisor sandbox holding files larger than its memory, one written and
// one sparse, takes files and checkpoint snapshots whole and lives on, and a
// restore brings them back. Stock runsc tars each file whole into the
// sandbox's memory: a 300 MiB file in a 256 MiB sandbox stopped it for OOM,
// later was refused with a 413, and a sparse file (`truncate -s 2G`) still
// stopped it; the runsc `make runsc` builds streams files
// (third_party/gvisor).
func TestLargeFileSnapshot(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"memory_mb": 256})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	if r := s.sh(id, "head -c 300M /dev/urandom > /home/user/big && truncate -s 1G /home/user/sparse && sha256sum /home/user/big"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	sum := s.sh(id, "sha256sum < /home/user/big").Stdout
	var files snapshotView
	for _, kind := range []string{"files", "checkpoint"} {
		sn := s.snapshot(id, kind, "")
		if sn.BytesTotal < 300<<20+1<<30 {
			t.Errorf("%s snapshot holds %d bytes, want the 300 MiB file and the 1 GiB sparse one", kind, sn.BytesTotal)
		}
		if kind == "files" {
			files = sn
		}
	}
	var sb sandboxView
	if s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); sb.State != "running" {
		t.Fatalf("sandbox after the snapshots: %+v", sb)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, &sb); code != 200 || sb.State != "paused" {
		t.Fatalf("pause: %d %+v", code, sb)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("resume: %d %+v", code, sb)
	}
	// Both come back from the files snapshot, byte for byte.
	if r := s.sh(id, "rm /home/user/big /home/user/sparse"); r.ExitCode != 0 {
		t.Fatalf("rm: %+v", r)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": files.ID, "paths": []string{"/home/user/big", "/home/user/sparse"}}, nil); code != 200 {
		t.Fatalf("restore: %d", code)
	}
	if r := s.sh(id, "sha256sum < /home/user/big; stat -c %s /home/user/sparse"); r.Stdout != sum+"1073741824\n" {
		t.Errorf("restored: %+v, want %q and the sparse size", r, sum)
	}
	// The sparse file came back sparse: the writable layer holds the
	// 300 MiB file, not 1.3 GiB (the agent leaves holes for zero blocks).
	r := s.sh(id, "df -m --output=used / | tail -1")
	if used, err := strconv.Atoi(strings.TrimSpace(r.Stdout)); err != nil || used > 700 {
		t.Errorf("writable layer after the restore: %q MiB used", r.Stdout)
	}
}

// A command running in the foreground while its sandbox is checkpointed
// (a snapshot, a fork) finishes for its client with all its output: the
// checkpoint cuts the agent's connection, and the exec's stream re-attaches
// (before, the exec answered 503 and a streaming client lost the stream).
func TestExecAcrossCheckpoint(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	type result struct {
		code int
		r    execResult
	}
	done := make(chan result, 1)
	go func() {
		var r execResult
		code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.25; done"}, &r)
		done <- result{code, r}
	}()
	waitFor(t, "the command to run", 30*time.Second, func() bool {
		for _, p := range s.processes(id) {
			if p.Running {
				return true
			}
		}
		return false
	})
	s.snapshot(id, "checkpoint", "")
	var kids struct{ Sandboxes []sandboxView }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/fork", s.key, map[string]any{"count": 1}, &kids); code != 201 || len(kids.Sandboxes) != 1 {
		t.Errorf("fork: %d %+v", code, kids)
	}
	for _, k := range kids.Sandboxes {
		defer s.do("DELETE", "/v1/sandboxes/"+k.ID, s.key, nil, nil)
	}
	select {
	case got := <-done:
		if got.code != 200 || got.r.ExitCode != 0 || got.r.Stdout != "1\n2\n3\n4\n5\n6\n7\n8\n" {
			t.Errorf("exec across a checkpoint and a fork: %d %+v", got.code, got.r)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("exec did not finish")
	}
}

// TestRestoreThroughLink: the sandbox's own code (as user) replaces a
// directory of a snapshot with a link to /etc; a restore (the agent writes
// as root) must not write through it. It did: the file landed in /etc and
// the link stayed.
func TestRestoreThroughLink(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	if r := s.sh(id, "mkdir ~/d && echo PAYLOAD > ~/d/space-restore-canary"); r.ExitCode != 0 {
		t.Fatalf("prepare: %+v", r)
	}
	snap := s.snapshot(id, "files", "")
	if r := s.sh(id, "rm -rf ~/d && ln -s /etc ~/d && ls -ld ~/d"); r.ExitCode != 0 {
		t.Fatalf("plant the link: %+v", r)
	}
	// One file under the link: refused, nothing written.
	var e apiError
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": snap.ID, "paths": []string{"/home/user/d/space-restore-canary"}}, &e); code != 400 || !strings.Contains(e.Message, "symbolic link") {
		t.Errorf("restore of a file under a link: %d %+v", code, e)
	}
	canary := func() string {
		var r execResult
		s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "test -e /etc/space-restore-canary && echo WRITTEN-IN-ETC; stat -c '%F %U' /home/user/d; cat /home/user/d/space-restore-canary", "user": "root"}, &r)
		return r.Stdout
	}
	if got := canary(); strings.Contains(got, "WRITTEN-IN-ETC") {
		t.Fatalf("a restore wrote through the link: %q", got)
	}
	// The whole home directory: the link is replaced by the directory.
	var res struct{ Written, Removed []string }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": snap.ID, "paths": []string{"/home/user"}}, &res); code != 200 {
		t.Fatalf("restore: %d %+v", code, res)
	}
	if got := canary(); got != "directory user\nPAYLOAD\n" {
		t.Errorf("after the restore: %q (written %v)", got, res.Written)
	}
}

// TestRestoreRemovesNotThroughLink: the snapshot has a link (~/d, to a
// root-owned directory) where the sandbox now has a directory with a file
// of the same name as one in the link's target. A restore puts the link
// back and must not then send the removal of ~/d/keep through it: it did,
// and removed /srv/victim/keep as root.
func TestRestoreRemovesNotThroughLink(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var r execResult
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "mkdir -p /srv/victim && echo ROOT > /srv/victim/keep", "user": "root"}, &r); code != 200 || r.ExitCode != 0 {
		t.Fatalf("prepare as root: %d %+v", code, r)
	}
	if r := s.sh(id, "ln -s /srv/victim ~/d"); r.ExitCode != 0 {
		t.Fatalf("link: %+v", r)
	}
	snap := s.snapshot(id, "files", "")
	if r := s.sh(id, "rm ~/d && mkdir ~/d && touch ~/d/keep"); r.ExitCode != 0 {
		t.Fatalf("replace the link: %+v", r)
	}
	var res struct{ Written, Removed []string }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"snapshot": snap.ID, "paths": []string{"/home/user"}}, &res); code != 200 {
		t.Fatalf("restore: %d %+v", code, res)
	}
	if r := s.sh(id, "readlink ~/d; cat /srv/victim/keep"); r.Stdout != "/srv/victim\nROOT\n" {
		t.Errorf("after the restore: %q (written %v, removed %v)", r.Stdout, res.Written, res.Removed)
	}
}

// TestTemplateIndexedInBackground: the first snapshot on a data directory
// starts indexing its template for full views in the background (once),
// so the first file history or restore does not wait for it.
func TestTemplateIndexedInBackground(t *testing.T) {
	s := startServer(t, "", "--pool-size", "-1", "--snapshot-interval", "-1")
	id := s.create(nil)
	s.snapshot(id, "files", "one")
	waitFor(t, "the template to be indexed in the background", 3*time.Minute, func() bool {
		return strings.Contains(s.logText(), "template indexed for snapshots")
	})
	sn := s.snapshot(id, "files", "two")
	if code := s.do("GET", "/v1/snapshots/"+sn.ID+"/files", s.key, nil, nil); code != 200 {
		t.Errorf("a snapshot's full file list: %d", code)
	}
	if n := strings.Count(s.logText(), "template indexed for snapshots"); n != 1 {
		t.Errorf("the template was indexed %d times, want once", n)
	}
}
