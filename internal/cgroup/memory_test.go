package cgroup

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// WatchMemory calls back once the usage reaches the threshold (the kernel
// signals the crossing), and SetMemoryLimit moves the hard limit both ways.
func TestWatchMemoryAndSetLimit(t *testing.T) {
	id := watchCgroup(t, "memwatch")
	// Writes 128 MiB to a file (page cache, which must not count), then
	// allocates 96 MiB, on command.
	h := startHog(t, id, Limits{MemoryMB: 256})
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
	if err := WatchMemory(ctx, id, 64<<20, func(u int64) int64 {
		select {
		case fired <- u:
		default:
		}
		return 0
	}); err != nil {
		t.Fatal(err)
	}
	h.do("write", 128, 0)
	h.done(t)
	if u, _ := MemoryUsage(id); u < 64<<20 {
		t.Logf("usage after writing the file only %d bytes (page cache written back?)", u)
	}
	select {
	case u := <-fired:
		t.Fatalf("fired at a working set of %d bytes for page cache", u)
	case <-time.After(300 * time.Millisecond):
	}
	h.do("grow", 96, 0)
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
	if err := WatchMemory(ctx, id, 64<<20, func(u int64) int64 {
		select {
		case late <- u:
		default:
		}
		return 0
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-late:
	case <-time.After(10 * time.Second):
		t.Fatal("no callback for a watch registered above its threshold")
	}
}

// memGuard's rules, look by look: the threshold, the pace of the looks,
// and the time after a kill while the killed process's memory is released.
func TestMemGuard(t *testing.T) {
	const mib = 1 << 20
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	g := memGuard{threshold: 256 * mib, timeout: releaseTimeout}
	limit := int64(320 * mib)
	check := func(step string, now time.Time, usage, ws int64, wantFree bool, want pause) {
		t.Helper()
		free, p := g.look(now, usage, ws, limit)
		if free != wantFree || (!free && p != want) {
			t.Fatalf("%s: look(usage %d MiB, ws %d MiB) = %v, %+v; want %v, %+v", step, usage/mib, ws/mib, free, p, wantFree, want)
		}
	}
	check("below", at(0), 100*mib, 100*mib, false, pause{event: true})
	// Page cache holds the usage up: look again before a process growing
	// at fastestGrowth could fill the room left (288 MiB: ~35 ms).
	check("page cache", at(0), 300*mib, 12*mib, false, pause{sleep: pollFor(12*mib, limit)})
	if w := pollFor(12*mib, limit); w < 30*time.Millisecond || w > 40*time.Millisecond {
		t.Fatalf("pollFor(12 MiB under 320) = %v", w)
	}
	check("3 MiB short", at(0), 256*mib, 253*mib, false, pause{sleep: pollFor(253*mib, limit)})
	if w := pollFor(253*mib, limit); w > 10*time.Millisecond {
		t.Fatalf("3 MiB short of the threshold, 67 under the limit, the next look is %v away", w)
	}
	check("at the threshold", at(0), 258*mib, 258*mib, true, pause{})
	// The kill at 258 MiB frees a 240 MiB process: its release is done at
	// 138 MiB; meanwhile the guard kills again only at 258 + (320-258)/2.
	if p := g.freed(at(0), 258*mib, 240*mib, limit); p != (pause{sleep: pollFor(258*mib, limit)}) {
		t.Fatalf("after a kill: %+v", p)
	}
	check("released late", at(10), 258*mib, 258*mib, false, pause{sleep: pollFor(258*mib, limit)})
	check("a new process grows into what is freed", at(20), 270*mib, 270*mib, false, pause{sleep: pollFor(270*mib, limit)})
	check("grows faster than the release", at(30), 289*mib, 289*mib, true, pause{})
	g.freed(at(30), 289*mib, 60*mib, limit) // the new one: both releases are awaited (done at 138)
	check("second release", at(40), 280*mib, 280*mib, false, pause{sleep: pollFor(280*mib, limit)})
	check("the new one's memory freed, the first's not yet", at(45), 229*mib, 229*mib, false, pause{sleep: pollFor(229*mib, limit)})
	check("both released", at(50), 130*mib, 130*mib, false, pause{event: true})
	check("at the threshold again", at(50), 259*mib, 259*mib, true, pause{})
	g.freed(at(50), 259*mib, 200*mib, limit)
	check("third release", at(60), 200*mib, 200*mib, false, pause{sleep: pollFor(200*mib, limit)})
	check("released", at(70), 140*mib, 140*mib, false, pause{event: true})
	check("after the release the threshold rules", at(80), 257*mib, 257*mib, true, pause{})
	// A release never seen is followed for releaseTimeout, no longer.
	g.freed(at(80), 257*mib, 100*mib, limit)
	check("not released", at(320), 257*mib, 257*mib, false, pause{sleep: pollFor(257*mib, limit)})
	check("not released in time", at(331), 257*mib, 257*mib, true, pause{})
	// A call that freed nothing: the next look in 250 ms.
	if p := g.freed(at(331), 257*mib, 0, limit); p != (pause{sleep: pollNothing}) || g.releasing {
		t.Fatalf("nothing freed: %+v, releasing %v", p, g.releasing)
	}
	check("nothing freed, still above", at(581), 257*mib, 257*mib, true, pause{})
	// No room, or the limit unknown: look as soon as allowed.
	if w := pollFor(330*mib, limit); w != pollMin {
		t.Fatalf("pollFor past the limit = %v", w)
	}
	if w := pollFor(10*mib, 1<<62); w != pollMax {
		t.Fatalf("pollFor with no limit = %v", w)
	}

	// Where reclaim is signalled: page cache holding the usage up is
	// waited out (a working set of 12 MiB cannot reach 256 before the
	// cgroup reclaims at 320), at most cacheBackstop, also at the limit
	// itself; a working set within the limit's room of the threshold is
	// looked at at its pace.
	g = memGuard{threshold: 256 * mib, timeout: releaseTimeout, reclaimEvents: true}
	cached := pause{sleep: pollFor(12*mib, limit), event: true, max: cacheBackstop}
	check("page cache, reclaim signalled", at(0), 300*mib, 12*mib, false, cached)
	cached.sleep = pollFor(12*mib, limit)
	check("page cache at the limit", at(0), 320*mib, 12*mib, false, cached)
	check("room enough to reach the threshold", at(0), 300*mib, 240*mib, false, pause{sleep: pollFor(240*mib, limit)})
	check("below", at(0), 100*mib, 100*mib, false, pause{event: true})
	check("at the threshold", at(0), 320*mib, 256*mib, true, pause{})
	g.freed(at(0), 256*mib, 200*mib, limit)
	check("releasing: looked at at its pace", at(10), 300*mib, 200*mib, false, pause{sleep: pollFor(200*mib, limit)})
}

// hog is a process in a test cgroup that grows and frees its memory on
// command, 1 MiB at a time with a pause between steps (glibc's mmap
// threshold fixed, so every MiB freed goes back to the kernel at once).
type hog struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

const hogScript = `import sys, time
chunks = []
for line in sys.stdin:
    verb, n, gap = line.split()
    n, gap = int(n), float(gap) / 1000
    if verb == 'write':  # n MiB to the file named by the first argument: page cache
        with open(sys.argv[1], 'wb') as f:
            for i in range(n):
                f.write(b'z' * (1 << 20))
    for i in range(n if verb != 'write' else 0):
        if verb == 'grow':
            chunks.append(b'x' * (1 << 20))
        elif chunks:
            chunks.pop()
        else:
            break
        if gap:
            time.sleep(gap)
    print(len(chunks), flush=True)
`

func startHog(t *testing.T, id string, lim Limits) *hog {
	t.Helper()
	cmd := exec.Command("python3", "-c", hogScript, filepath.Join(t.TempDir(), "cache"))
	cmd.Env = append(os.Environ(), "MALLOC_MMAP_THRESHOLD_=131072")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := Start(id, cmd, lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &hog{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// do sends a command ("grow" or "free", MiB, ms between steps; "write",
// MiB, 0).
func (h *hog) do(verb string, mib, gapMS int) {
	fmt.Fprintf(h.in, "%s %d %d\n", verb, mib, gapMS)
}

// done waits for the command sent before to finish and returns the MiB held.
func (h *hog) done(t *testing.T) int {
	t.Helper()
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("hog %d: %v (killed?)", h.cmd.Process.Pid, err)
	}
	n, _ := strconv.Atoi(line[:len(line)-1])
	return n
}

// After a kill the watch follows the killed process's release: a process
// that takes memory while the release is under way is left alone as long
// as the working set stays below halfway to the host's limit (it is
// innocent: the killed process's memory is still counted), one that grows
// past that is stopped before the host's limit, and once the release is
// done the threshold rules again. The release is made slow on purpose
// (gVisor's is 20-40 ms late); the host's limit must never be reached.
func TestWatchMemoryFollowsRelease(t *testing.T) {
	const mib = 1 << 20
	id := watchCgroup(t, "memrelease")
	lim := Limits{MemoryMB: 256} // the host's limit; the watch's threshold is 128 MiB
	// The hogs' pace is set by sleeps that a busy host stretches (the e2e
	// suite runs beside this test): the release is followed as long as it
	// takes here, so that the phases do not depend on it (TestMemGuard
	// covers the timeout).
	defer func(d time.Duration) { releaseTimeout = d }(releaseTimeout)
	releaseTimeout = 5 * time.Second
	a, b := startHog(t, id, lim), startHog(t, id, lim)
	a.do("grow", 0, 0) // both interpreters started: what they hold is the base
	b.do("grow", 0, 0)
	a.done(t)
	b.done(t)
	base, err := MemoryUsage(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type call struct {
		n  int
		ws int64
	}
	calls := make(chan call, 16)
	var n int
	// fn plays the agent: it "kills" by telling a hog to free its memory
	// (slowly, where the test wants a late release), starts whatever the
	// phase needs next, and returns the victim's resident memory.
	if err := WatchMemory(ctx, id, 128*mib, func(ws int64) int64 {
		n++
		calls <- call{n, ws}
		switch n {
		case 1: // a at the threshold frees over ~130 ms; b takes 20 MiB at once
			a.do("free", 1000, 1)
			b.do("grow", 20, 0)
			return rss(a.cmd.Process.Pid)
		case 2: // b alone at the threshold
			b.do("free", 1000, 0)
			return rss(b.cmd.Process.Pid)
		case 3: // a again, freeing slower still; b grows 230 MiB fast: a+b would pass 256
			a.do("free", 1000, 5)
			b.do("grow", 230, 1)
			return rss(a.cmd.Process.Pid)
		case 4: // b, caught growing during a's release
			held := rss(b.cmd.Process.Pid)
			if held == 0 {
				t.Errorf("b gone before the watch stopped it")
			}
			_ = b.cmd.Process.Kill()
			return held
		}
		return 0
	}); err != nil {
		t.Fatal(err)
	}
	next := func(what string) call {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no call: %s", what)
		}
		return call{}
	}
	none := func(what string) {
		t.Helper()
		select {
		case c := <-calls:
			t.Fatalf("%s: call %d at a working set of %d MiB", what, c.n, c.ws/mib)
		default:
		}
	}
	// a grows to 2 MiB past the threshold: the watch calls at 128 or a
	// little later, so the working set at the kill is within 2 MiB of all
	// a will hold, and a's leftover plus b's 20 MiB stay below the 32 MiB
	// past it where the watch would kill again, however late a's release
	// (and right after the kill the working set is still above 128).
	toThreshold := int((128*mib-base)/mib) + 2

	a.do("grow", toThreshold, 0)
	if c := next("a grew past the threshold"); c.n != 1 || c.ws < 128*mib {
		t.Fatalf("first call %+v", c)
	}
	a.done(t) // the grow
	if held := a.done(t); held != 0 {
		t.Fatalf("a holds %d MiB after its release", held)
	}
	if held := b.done(t); held != 20 {
		t.Fatalf("b holds %d MiB", held)
	}
	time.Sleep(50 * time.Millisecond) // a look after the release
	none("b took 20 MiB while a's memory was being freed: innocent")

	b.do("grow", toThreshold-20, 0)
	if c := next("b alone past the threshold"); c.n != 2 {
		t.Fatalf("second call %+v", c)
	}
	b.done(t) // the grow
	b.done(t) // the free

	a.do("grow", toThreshold, 0)
	if c := next("a past the threshold again"); c.n != 3 {
		t.Fatalf("third call %+v", c)
	}
	if c := next("b growing faster than a's release"); c.n != 4 {
		t.Fatalf("fourth call %+v", c)
	}
	a.done(t) // the grow
	if held := a.done(t); held != 0 {
		t.Fatalf("a holds %d MiB after its release", held)
	}
	none("after the release")
	d := filepath.Join(Root, "memory", Parent, id)
	if peak, _ := strconv.ParseInt(read(t, filepath.Join(d, "memory.max_usage_in_bytes")), 10, 64); peak >= 256*mib {
		t.Errorf("peak usage %d MiB: the host's limit was reached", peak/mib)
	}
	if oc := read(t, filepath.Join(d, "memory.oom_control")); !strings.Contains(oc, "oom_kill 0") {
		t.Errorf("the host's OOM killer ran: %s", oc)
	}
}

// rss is a process's resident memory in bytes (0: gone), as the agent
// reports a victim's.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// While page cache alone holds a cgroup's usage above the threshold (a
// sandbox that wrote more files than its headroom holds), the watch waits
// for the cgroup to reclaim instead of looking at its pace, 20-30 times a
// second for as long as the cache stayed; and it still catches a process
// that grows then, before the host's limit.
func TestWatchMemoryPageCache(t *testing.T) {
	const mib = 1 << 20
	id := watchCgroup(t, "memcache")
	h := startHog(t, id, Limits{MemoryMB: 256})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	calls := make(chan int64, 16)
	if err := WatchMemory(ctx, id, 128*mib, func(ws int64) int64 {
		calls <- ws
		held := rss(h.cmd.Process.Pid)
		_ = h.cmd.Process.Kill() // as the agent does
		return held
	}); err != nil {
		t.Fatal(err)
	}
	h.do("write", 400, 0)
	h.done(t)
	if u, _ := MemoryUsage(id); u < 200*mib {
		t.Fatalf("usage after writing 400 MiB under a 256 MiB limit: %d MiB (page cache not charged?)", u/mib)
	}
	time.Sleep(100 * time.Millisecond)
	before := looks.Load()
	time.Sleep(1500 * time.Millisecond)
	if n := looks.Load() - before; n > 3 {
		t.Errorf("%d looks at the working set in 1.5 s of page cache alone (want at most the second's backstop)", n)
	}
	select {
	case ws := <-calls:
		t.Fatalf("called at a working set of %d MiB for page cache", ws/mib)
	default:
	}
	h.do("grow", 300, 0) // reclaims the cache as it grows, past the threshold and the limit
	select {
	case ws := <-calls:
		if ws < 128*mib {
			t.Fatalf("called at %d MiB", ws/mib)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no call while a process grew past the threshold through page cache")
	}
	_ = h.cmd.Wait()
	if oc := read(t, filepath.Join(Root, "memory", Parent, id, "memory.oom_control")); !strings.Contains(oc, "oom_kill 0") {
		t.Errorf("the host's OOM killer ran first: %s", oc)
	}
}

// A watch leaves nothing behind (its goroutines and eventfds) when its
// context ends or its cgroup is removed.
func TestWatchMemoryEnds(t *testing.T) {
	id := watchCgroup(t, "memends")
	fds := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	settled := func(what string, goroutines, open int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > goroutines || fds() > open {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d goroutines (%d before), %d fds (%d before)", what, runtime.NumGoroutine(), goroutines, fds(), open)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, end := range []string{"context", "cgroup removed"} {
		cmd := exec.Command("sleep", "60")
		if err := Start(id, cmd, Limits{MemoryMB: 64}); err != nil {
			t.Fatal(err)
		}
		// Before the cgroup's removal (cleanups run last first), so a
		// failed run does not leave the cgroup behind.
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		goroutines, open := runtime.NumGoroutine(), fds()
		ctx, cancel := context.WithCancel(t.Context())
		if err := WatchMemory(ctx, id, 32<<20, func(int64) int64 { return 0 }); err != nil {
			t.Fatal(err)
		}
		// The watch's goroutine reads the cgroup's files, each open for a
		// moment: the count settles at the two eventfds.
		for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() <= goroutines || fds() != open+2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watching: %d goroutines (%d before), %d fds (%d before): want the watch's and two eventfds", runtime.NumGoroutine(), goroutines, fds(), open)
			}
		}
		if end == "context" {
			cancel()
			settled(end, goroutines, open)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err := Remove(id); err != nil {
			t.Fatal(err)
		}
		settled(end, goroutines, open)
		cancel()
	}
}

// watchCgroup is the id of a test cgroup for a memory watch, removed at the
// end of the test; it skips the test where the watch is not implemented.
func watchCgroup(t *testing.T, name string) string {
	t.Helper()
	needRoot(t)
	if Unified() {
		t.Skip("memory watch is cgroup v1 only (see ErrNoMemoryWatch); this host runs v2")
	}
	id := fmt.Sprintf("test-%s-%d", name, os.Getpid())
	t.Cleanup(func() { _ = Remove(id) })
	return id
}
