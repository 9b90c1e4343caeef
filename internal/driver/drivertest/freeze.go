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

// Contiguous checks that the count goes up by one each line: the
// in-memory counter went on where the file left off (across a pause, a
// checkpoint, a resume).
func Contiguous(ticks []Tick) error {
	if len(ticks) < 2 {
		return fmt.Errorf("%d ticks", len(ticks))
	}
	for i := 1; i < len(ticks); i++ {
		if ticks[i].N != ticks[i-1].N+1 {
			return fmt.Errorf("tick %d follows tick %d", ticks[i].N, ticks[i-1].N)
		}
	}
	return nil
}

// Within returns the ticks made strictly between from and to by the
// host's clock, the guest's being ahead of it by offset.
func Within(ticks []Tick, offset time.Duration, from, to time.Time) []Tick {
	var out []Tick
	for _, tk := range ticks {
		if at := tk.At.Add(-offset); at.After(from) && at.Before(to) {
			out = append(out, tk)
		}
	}
	return out
}

// LastBefore returns the index of the last tick made before t by the
// host's clock (the guest's ahead by offset), -1 if none.
func LastBefore(ticks []Tick, offset time.Duration, t time.Time) int {
	last := -1
	for i, tk := range ticks {
		if tk.At.Add(-offset).Before(t) {
			last = i
		}
	}
	return last
}

// ClockSlack is what the guest's clock may be off by over a pause of a
// second (gVisor recalibrates its clock from the host's as it runs): a
// bound on the measurement, not on a speed.
const ClockSlack = 2 * time.Millisecond

// testPauseFreezesAtOnce: once Pause returns, the sandbox does nothing
// more. A process counting every 20 ms runs across a pause held for a
// second; by the guest's clock (its offset from the host's measured
// before) no tick was made between Pause's return and Resume's call. A
// freeze that came after Pause returned leaves ticks in that span.
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
	before := time.Now()
	g0 := guestClock()
	h0 := time.Now()
	// The guest's clock against the host's, as well as one exec can tell.
	offset, unc := g0.Sub(before.Add(h0.Sub(before)/2)), h0.Sub(before)/2
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
	if err := Contiguous(ticks); err != nil {
		t.Fatal(err)
	}
	slack := ClockSlack + unc
	if bad := Within(ticks, offset, acked.Add(slack), resumed.Add(-slack)); len(bad) > 0 {
		t.Errorf("ticks %d..%d were made after Pause returned and before Resume (clock offset %v ± %v)", bad[0].N, bad[len(bad)-1].N, offset, slack)
	}
	last := LastBefore(ticks, offset, resumed)
	if last < 0 || last == len(ticks)-1 {
		t.Fatalf("no ticks on both sides of the pause: %d of %d before the resume", last+1, len(ticks))
	}
	t.Logf("last tick before the pause %d; silence %v; frozen (Pause returned → Resume) %v; clock offset %v ± %v",
		ticks[last].N, ticks[last+1].At.Sub(ticks[last].At).Round(time.Millisecond), resumed.Sub(acked).Round(time.Millisecond), offset.Round(time.Millisecond), slack.Round(time.Millisecond))
}
