package e2e

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/driver/drivertest"
)

// tickFile is where the ticker writes: under /home/user, in the writable
// layer a checkpoint's file view holds.
const tickFile = "/home/user/ticks"

// startTicker runs drivertest.TickerScript in sandbox id and waits for
// its first ticks.
func startTicker(t *testing.T, s *server, id string) {
	t.Helper()
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"/bin/sh", "-c", drivertest.TickerScript, "ticker", tickFile}, "background": true}, nil); code != 202 {
		t.Fatalf("start ticker: %d", code)
	}
	waitFor(t, "ticker to start", 20*time.Second, func() bool { return len(readTicks(t, s, id)) >= 3 })
}

func readTicks(t *testing.T, s *server, id string) []drivertest.Tick {
	t.Helper()
	ticks, err := drivertest.ParseTicks(s.sh(id, "cat "+tickFile+" 2>/dev/null").Stdout)
	if err != nil {
		t.Fatalf("ticks: %v", err)
	}
	return ticks
}

// snapshotTicks reads the ticker's file as checkpoint sid holds it.
func snapshotTicks(t *testing.T, s *server, sid string) []drivertest.Tick {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/snapshots/"+sid+"/files?path="+tickFile, nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("ticks in checkpoint %s: %d %s", sid, resp.StatusCode, b)
	}
	ticks, err := drivertest.ParseTicks(string(b))
	if err != nil {
		t.Fatalf("ticks in checkpoint %s: %v", sid, err)
	}
	return ticks
}

type timelineEntry struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Status    string `json:"status"`
	Error     string `json:"error"`
	Automatic bool   `json:"automatic"`
}

func lastSnapshot(t *testing.T, s *server, id string) timelineEntry {
	t.Helper()
	var tl struct{ Snapshots []timelineEntry }
	if code := s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl); code != 200 || len(tl.Snapshots) == 0 {
		t.Fatalf("timeline: %d %+v", code, tl.Snapshots)
	}
	return tl.Snapshots[len(tl.Snapshots)-1]
}

// checkFrozenAt checks a sandbox paused at acked (its pause answered, or
// seen paused), held so until resumed (the resume call) and running again
// since: no tick was made in that span (gVisor's clock is the host's),
// and the pause's checkpoint (sid) holds exactly the state the pause
// froze: its last tick is the last one before the resume. A freeze after
// acked leaves ticks in the span; a checkpoint taken while the sandbox
// still ran (and then the freeze) holds an earlier tick.
func checkFrozenAt(t *testing.T, s *server, id, sid string, acked, resumed time.Time) {
	t.Helper()
	n := len(readTicks(t, s, id))
	waitFor(t, "ticks after resume", 30*time.Second, func() bool { return len(readTicks(t, s, id)) >= n+3 })
	ticks := readTicks(t, s, id)
	if err := drivertest.Contiguous(ticks); err != nil {
		t.Fatal(err)
	}
	slack := drivertest.ClockSlack
	if bad := drivertest.Within(ticks, 0, acked.Add(slack), resumed.Add(-slack)); len(bad) > 0 {
		t.Errorf("ticks %d..%d were made after the pause was acknowledged and before the resume", bad[0].N, bad[len(bad)-1].N)
	}
	last := drivertest.LastBefore(ticks, 0, resumed)
	if last < 0 || last == len(ticks)-1 {
		t.Fatalf("no ticks on both sides of the pause: %d of %d before the resume", last+1, len(ticks))
	}
	if sn := snapshotTicks(t, s, sid); len(sn) == 0 || sn[len(sn)-1].N != ticks[last].N {
		got := "none"
		if len(sn) > 0 {
			got = fmt.Sprint(sn[len(sn)-1].N)
		}
		t.Errorf("the pause's checkpoint holds tick %s, the pause froze the sandbox after tick %d: the checkpoint is not of the paused state", got, ticks[last].N)
	}
	t.Logf("last tick before the pause %d, next %v later (frozen by the host's clock: %v)",
		ticks[last].N, ticks[last+1].At.Sub(ticks[last].At).Round(time.Millisecond), resumed.Sub(acked).Round(time.Millisecond))
}

// TestPauseFreezesAtOnce: the pause call answers once the sandbox is
// frozen, its timeline gets the pause's checkpoint (taken afterwards, of
// the frozen sandbox), and the sandbox did nothing between the answer
// and the resume.
func TestPauseFreezesAtOnce(t *testing.T) {
	s := sharedServer(t)
	id := s.createOn(t, "gvisor", nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	startTicker(t, s, id)
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, &sb); code != 200 || sb.State != "paused" {
		t.Fatalf("pause: %d %+v", code, sb)
	}
	acked := time.Now()
	cp := lastSnapshot(t, s, id)
	if cp.Kind != "checkpoint" || !cp.Automatic || (cp.Status != "creating" && cp.Status != "ready") {
		t.Fatalf("the pause's checkpoint in the timeline: %+v", cp)
	}
	time.Sleep(time.Second) // held paused
	resumed := time.Now()
	// The resume waits for the checkpoint to be stored.
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("resume: %d %+v", code, sb)
	}
	answered := time.Now()
	if r := s.sh(id, "true"); r.ExitCode != 0 {
		t.Fatalf("exec after resume: %+v", r)
	}
	t.Logf("first exec after resume answered %v after the resume (the agent's reconnection)", time.Since(answered).Round(time.Millisecond))
	if cp = lastSnapshot(t, s, id); cp.Status != "ready" {
		t.Fatalf("the pause's checkpoint after resume: %+v", cp)
	}
	checkFrozenAt(t, s, id, cp.ID, acked, resumed)
}

// TestTimeoutPauseFreezesAtOnce: the pause a timeout triggers takes the
// same path: the sandbox is seen paused only once it is frozen, and the
// checkpoint is of the frozen state.
func TestTimeoutPauseFreezesAtOnce(t *testing.T) {
	s := sharedServer(t)
	id := s.createOn(t, "gvisor", map[string]any{"timeout_s": 600, "on_timeout": "pause"})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	startTicker(t, s, id)
	// Its timeout ends a second from now (a create on a busy host can
	// take longer than a short timeout_s).
	if code := s.do("POST", "/v1/sandboxes/"+id+"/timeout", s.key, map[string]any{"timeout_s": 1}, nil); code != 200 {
		t.Fatalf("timeout: %d", code)
	}
	// Watched closely: the moment it is first seen paused is the
	// acknowledgment (waitFor's 50 ms would hide a late freeze).
	var sb sandboxView
	var acked time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
		if acked = time.Now(); sb.State == "paused" {
			break
		}
		if acked.After(deadline) {
			t.Fatalf("not paused by its timeout: %+v", sb)
		}
	}
	cp := lastSnapshot(t, s, id)
	if cp.Kind != "checkpoint" || !cp.Automatic {
		t.Fatalf("the timeout pause's checkpoint in the timeline: %+v", cp)
	}
	time.Sleep(time.Second) // held paused
	resumed := time.Now()
	if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("resume: %d %+v", code, sb)
	}
	// Not paused again by its next period while the ticks are read.
	if code := s.do("POST", "/v1/sandboxes/"+id+"/timeout", s.key, map[string]any{"timeout_s": 600}, nil); code != 200 {
		t.Fatalf("timeout: %d", code)
	}
	if cp = lastSnapshot(t, s, id); cp.Status != "ready" {
		t.Fatalf("the timeout pause's checkpoint after resume: %+v", cp)
	}
	checkFrozenAt(t, s, id, cp.ID, acked, resumed)
}
