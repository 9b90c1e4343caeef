package drivertest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
)

// TickerScript counts in memory and appends "count unix-ns" to the file
// named by $1 every 20 ms, so the file is the process's history. (Shell
// and date: the suite's templates need not have Python.)
const TickerScript = `i=0; while :; do i=$((i+1)); echo "$i $(date +%s%N)" >> "$1"; sleep 0.02; done`

// Tick is one line the ticker wrote.
type Tick struct {
	N  int
	At time.Time // the guest's clock
}

// ParseTicks reads the ticker's file. A last line cut short (read while
// it was being written) is left out.
func ParseTicks(s string) ([]Tick, error) {
	var out []Tick
	lines := strings.Split(s, "\n")
	for i, ln := range lines {
		f := strings.Fields(ln)
		if len(f) != 2 {
			if i == len(lines)-1 {
				break
			}
			return nil, fmt.Errorf("line %d: %q", i+1, ln)
		}
		n, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("line %d: %q", i+1, ln)
		}
		out = append(out, Tick{N: n, At: time.Unix(0, ns)})
	}
	return out, nil
}

// FreezeGap checks the ticks of a process that ran across one pause: the
// count goes up by one each line (the in-memory counter continued where
// the file left off), and it returns the index of the last tick before
// the longest pause between two ticks, and that pause.
func FreezeGap(ticks []Tick) (int, time.Duration, error) {
	if len(ticks) < 2 {
		return 0, 0, fmt.Errorf("%d ticks", len(ticks))
	}
	last, gap := 0, time.Duration(-1)
	for i := 1; i < len(ticks); i++ {
		if ticks[i].N != ticks[i-1].N+1 {
			return 0, 0, fmt.Errorf("tick %d follows tick %d", ticks[i].N, ticks[i-1].N)
		}
		if d := ticks[i].At.Sub(ticks[i-1].At); d > gap {
			last, gap = i-1, d
		}
	}
	return last, gap, nil
}

// ClockSlack is what the guest's clock may be off by over a pause of a
// second (gVisor recalibrates its clock from the host's as it runs): a
// bound on the measurement, not on a speed.
const ClockSlack = 2 * time.Millisecond

// testPauseFreezesAtOnce: once Pause returns, the sandbox does nothing
// more. A process counting every 20 ms runs across a pause held for
// hold; the guest's clock must show no tick in all of the time between
// Pause's return and Resume's call: a freeze that came after Pause
// returned shortens that silence by however long it came late.
func testPauseFreezesAtOnce(t *testing.T, s Setup, d driver.Driver) {
	testFrozen(t, s, d, nil)
}

// testCheckpointWhilePaused: a checkpoint of a paused instance (what a
// pause's rolling-history checkpoint is) leaves it paused all along, and
// its agent answers again after Resume.
func testCheckpointWhilePaused(t *testing.T, s Setup, d driver.Driver) {
	if !d.Capabilities().Has(driver.CapCheckpoint) {
		t.Skipf("driver %s lacks %s", d.Name(), driver.CapCheckpoint)
	}
	testFrozen(t, s, d, func(inst driver.Instance) {
		cp, ok := inst.(driver.Checkpointer)
		if !ok {
			t.Fatalf("driver %s announces %s but its instance is no Checkpointer", d.Name(), driver.CapCheckpoint)
		}
		if err := cp.Checkpoint(t.Context(), t.TempDir(), true); err != nil {
			t.Fatalf("Checkpoint of the paused instance: %v", err)
		}
	})
}

// testFrozen runs the ticker across a pause, calling whilePaused (when
// set) while it is paused, and checks that it made no tick from Pause's
// return to Resume's call.
func testFrozen(t *testing.T, s Setup, d driver.Driver, whilePaused func(driver.Instance)) {
	if !d.Capabilities().Has(driver.CapPause) {
		t.Skipf("driver %s lacks %s", d.Name(), driver.CapPause)
	}
	inst, c, _ := started(t, s, d)
	ctx := t.Context()
	const file = "/tmp/ticks"
	if _, err := c.Start(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", TickerScript, "ticker", file}}); err != nil {
		t.Fatal(err)
	}
	read := func() []Tick {
		out, _ := sh(t, c, "cat "+file+" 2>/dev/null")
		ticks, err := ParseTicks(out)
		if err != nil {
			t.Fatalf("ticks: %v", err)
		}
		return ticks
	}
	waitFor(t, func() bool { return len(read()) >= 5 })
	guestClock := func() time.Time {
		out, _ := sh(t, c, "date +%s%N")
		ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if err != nil {
			t.Fatalf("guest clock %q: %v", out, err)
		}
		return time.Unix(0, ns)
	}
	g0, h0 := guestClock(), time.Now()
	const hold = time.Second
	if err := inst.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	acked := time.Now()
	time.Sleep(hold) // the sandbox is held frozen this long
	if whilePaused != nil {
		whilePaused(inst)
	}
	resumed := time.Now()
	if err := inst.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	n := len(read())
	waitFor(t, func() bool { return len(read()) >= n+3 })
	g1, h1 := guestClock(), time.Now()
	if lost, paused := h1.Sub(h0)-g1.Sub(g0), resumed.Sub(acked); lost > paused/2 {
		t.Skipf("the guest's clock stood still for %v of the %v it was paused (a VM's clock stops with it, and a checkpoint saves and restores it), so its ticks cannot tell when they were made",
			lost.Round(time.Millisecond), paused.Round(time.Millisecond))
	}
	ticks := read()
	last, gap, err := FreezeGap(ticks)
	if err != nil {
		t.Fatal(err)
	}
	frozen := resumed.Sub(acked)
	if gap+ClockSlack < frozen {
		t.Errorf("the longest silence of the ticker is %v (after tick %d), shorter than the %v between Pause's return and Resume: it ran on after Pause returned",
			gap.Round(time.Millisecond), ticks[last].N, frozen.Round(time.Millisecond))
	}
	t.Logf("silence %v after tick %d; frozen (Pause returned → Resume) %v", gap.Round(time.Millisecond), ticks[last].N, frozen.Round(time.Millisecond))
}
