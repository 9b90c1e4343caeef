package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoMemoryWatch is returned by WatchMemory on hosts where it is not
// implemented (cgroup v2: memory.high and memory.events would be the way;
// not written, as this project's hosts run v1 and it could not be tested).
var ErrNoMemoryWatch = errors.New("cgroup: memory watch needs cgroup v1")

// SetMemoryLimit changes the hard memory limit (and memory+swap, where
// swap is accounted) of a sandbox's existing cgroup, made by this package
// or by runsc.
func SetMemoryLimit(id string, bytes int64) error {
	if err := checkID(id); err != nil {
		return err
	}
	b := strconv.FormatInt(bytes, 10)
	if Unified() {
		return write(filepath.Join(Root, Parent, id), "memory.max", b)
	}
	d := filepath.Join(Root, "memory", Parent, id)
	cur, err := readInt(filepath.Join(d, "memory.limit_in_bytes"))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	// memory+swap may never be below memory: raise it first, lower it last.
	files := []string{"memory.memsw.limit_in_bytes", "memory.limit_in_bytes"}
	if bytes < cur {
		files[0], files[1] = files[1], files[0]
	}
	for _, f := range files {
		if optional[f] {
			if _, err := os.Stat(filepath.Join(d, f)); err != nil {
				continue
			}
		}
		if err := write(d, f, b); err != nil {
			return err
		}
	}
	return nil
}

// MemoryUsage returns a sandbox's current memory use in bytes.
func MemoryUsage(id string) (int64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	if Unified() {
		return readInt(filepath.Join(Root, Parent, id, "memory.current"))
	}
	return readInt(filepath.Join(Root, "memory", Parent, id, "memory.usage_in_bytes"))
}

// WatchMemory calls fn (on a goroutine of its own, one call at a time)
// whenever the sandbox's working set (its memory use less the page cache
// of files, which the kernel reclaims at the limit: writing a large file
// must not count) is at threshold bytes or above, until ctx ends or the
// cgroup is removed. fn frees memory (kills a process) and returns how much
// it expects to free: the memory of what it killed, 0 when it freed nothing.
//
// On cgroup v1 the kernel signals an eventfd when the usage crosses the
// threshold (memory thresholds of cgroup.event_control), and another on
// reclaim in the cgroup (memory.pressure_level). The working set is read
// only while the usage is above the threshold or a kill's memory is being
// released, as often as the room left under the cgroup's hard limit needs,
// and not at all while page cache alone holds the usage up (see memGuard).
// The eventfds wait in Go's poller, not on a thread. On cgroup v2 it
// returns ErrNoMemoryWatch.
func WatchMemory(ctx context.Context, id string, threshold int64, fn func(workingSet int64) (freed int64)) error {
	if err := checkID(id); err != nil {
		return err
	}
	if Unified() {
		return ErrNoMemoryWatch
	}
	d := filepath.Join(Root, "memory", Parent, id)
	usage, err := os.Open(filepath.Join(d, "memory.usage_in_bytes"))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	defer usage.Close() // needed to register only: the kernel keeps what it needs
	crossed, err := register(d, usage, strconv.FormatInt(threshold, 10))
	if err != nil {
		return err
	}
	events := []*os.File{crossed}
	// Best effort: without it the watch looks at its pace while page
	// cache holds the usage above the threshold, as it did before.
	if pl, err := os.Open(filepath.Join(d, "memory.pressure_level")); err == nil {
		if reclaim, err := register(d, pl, "low"); err == nil {
			events = append(events, reclaim)
		}
		pl.Close()
	}
	timeout := releaseTimeout
	wake := make(chan struct{}, 1)
	for _, f := range events {
		go notify(f, wake)
	}
	go func() {
		defer func() {
			for _, f := range events {
				f.Close() // ends notify
			}
		}()
		g := memGuard{threshold: threshold, timeout: timeout, reclaimEvents: len(events) > 1}
		for {
			u, err := readInt(filepath.Join(d, "memory.usage_in_bytes"))
			if err != nil {
				return // removed
			}
			ws, limit := u, int64(0) // read only where they matter
			if g.releasing || u >= threshold {
				ws = workingSet(d, u)
				limit, _ = readInt(filepath.Join(d, "memory.limit_in_bytes"))
				looks.Add(1)
			}
			free, p := g.look(time.Now(), u, ws, limit)
			if free {
				p = g.freed(time.Now(), ws, fn(ws), limit)
			}
			if p.sleep > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(p.sleep):
				}
			}
			if !p.event {
				continue
			}
			var backstop <-chan time.Time
			if p.max > 0 {
				backstop = time.After(p.max)
			}
			select {
			case <-ctx.Done():
				return
			case <-wake: // a crossing (down as well as up), reclaim, or the cgroup removed
			case <-backstop:
			}
		}
	}()
	return nil
}

// register asks the kernel to signal a new eventfd on the control file f
// of cgroup d with args (cgroup v1 cgroup.event_control). The eventfd is
// non-blocking, read in Go's poller.
func register(d string, f *os.File, args string) (*os.File, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("cgroup: eventfd: %w", err)
	}
	ev := os.NewFile(uintptr(efd), "eventfd")
	if err := write(d, "cgroup.event_control", fmt.Sprintf("%d %d %s", efd, f.Fd(), args)); err != nil {
		ev.Close()
		return nil, err
	}
	return ev, nil
}

// notify wakes the watch on each signal of ev, until ev is closed.
func notify(ev *os.File, wake chan<- struct{}) {
	buf := make([]byte, 8)
	for {
		if _, err := ev.Read(buf); err != nil {
			return
		}
		select {
		case wake <- struct{}{}:
		default: // one pending wake-up stands for any number
		}
	}
}

// looks counts the watches' reads of a working set (tests).
var looks atomic.Int64

// How memGuard paces its looks.
const (
	// fastestGrowth is the allocation rate the looks are paced for: the
	// next look comes before a process growing this fast could use the
	// room left under the hard limit. A 400 MiB allocation in gVisor here
	// grew by 64 MiB in under 50 ms (1.3 GB/s); the pace allows for 6x
	// that, as the kill itself takes a few ms more.
	fastestGrowth = 8 << 30 // bytes per second
	pollMin       = 2 * time.Millisecond
	pollMax       = 50 * time.Millisecond
	// pollNothing is the wait after a call that freed nothing.
	pollNothing = 250 * time.Millisecond
	// cacheBackstop bounds the wait for a reclaim event while page cache
	// holds the usage up (see memGuard).
	cacheBackstop = time.Second
)

// releaseTimeout bounds how long a kill's release is followed: gVisor
// released a killed process's memory 20-40 ms after the kill here. While
// it is followed, a process that outgrew its memory lives on until the
// release is seen done (its memory can fill what the killed one freed, so
// it may never be) or this has passed. A var for tests.
var releaseTimeout = 250 * time.Millisecond

// pause is what the watch does before its next look: sleep, then, with
// event, wait for a kernel event (a crossing of the threshold, reclaim in
// the cgroup, its removal) for at most max (0: no bound).
type pause struct {
	sleep time.Duration
	event bool
	max   time.Duration
}

// memGuard decides from successive looks at a sandbox's memory when to
// free memory and when to look next.
//
// Above the threshold the working set is read as often as the room left
// under the hard limit needs (pollFor): a fixed 50 ms let a fast
// allocation that was 3 MiB short of the threshold at one look reach the
// host's limit, 64 MiB further, by the next (the whole sandbox stops).
// Except while page cache alone keeps the usage above the threshold (a
// sandbox that wrote or read more files than its headroom holds, an
// everyday thing, and the cache stays charged until reclaimed): when the
// working set plus the room left under the limit is below the threshold,
// no process can reach the threshold before the cgroup reclaims, and
// reclaim is signalled. The guard then waits for that signal (at most a
// second, in case the host's own reclaim shrank the cache meanwhile)
// instead of looking 20-30 times a second for as long as the cache stays.
//
// The subtle part is the time after a kill: gVisor releases a killed
// process's memory to the host tens of milliseconds late, so for a while
// the working set still counts it. Killing again because of that took an
// innocent process; not looking at all for a while (250 ms) let a new
// allocation run into the host's limit unseen. So after a kill the guard
// keeps looking and kills again only when the working set grows halfway
// from its level at the kill to the hard limit: something allocates
// faster than the release frees. The release counts as done once half the
// killed process's memory is gone (after a second kill during a release,
// once both are), or after 250 ms; then the threshold rules again.
type memGuard struct {
	threshold     int64
	timeout       time.Duration // releaseTimeout
	reclaimEvents bool          // reclaim in the cgroup is signalled

	releasing bool
	released  int64     // the release is done at or below this working set
	again     int64     // while releasing, kill again at or above this
	until     time.Time // the release is not waited for after this
}

// look takes the usage, working set and hard limit (0 or less: unknown)
// now and says whether to free memory, or else what to do before the next
// look.
func (g *memGuard) look(now time.Time, usage, ws, limit int64) (free bool, p pause) {
	if g.releasing {
		if ws > g.released && now.Before(g.until) {
			return ws >= g.again, pause{sleep: pollFor(ws, limit)}
		}
		g.releasing = false
	}
	switch {
	case usage < g.threshold:
		return false, pause{event: true}
	case ws >= g.threshold:
		return true, pause{}
	case g.reclaimEvents && limit > 0 && ws+max(limit-usage, 0) < g.threshold:
		// Page cache holds the usage up: growth past the limit's room
		// makes the cgroup reclaim, which wakes the watch.
		return false, pause{sleep: pollFor(ws, limit), event: true, max: cacheBackstop}
	default:
		return false, pause{sleep: pollFor(ws, limit)}
	}
}

// freed records a call to free memory at working set ws that expects to
// free freed bytes, and returns what to do before the next look.
func (g *memGuard) freed(now time.Time, ws, freed, limit int64) pause {
	if freed <= 0 {
		g.releasing = false
		return pause{sleep: pollNothing}
	}
	margin := g.threshold / 4 // where the limit is unknown or far
	if limit > 0 {
		margin = min(margin, max(limit-ws, 0)/2)
	}
	released := ws - freed/2
	if g.releasing {
		// A kill during a release: both are awaited (what the first
		// frees is still counted in ws).
		released = min(released, g.released)
	}
	g.releasing = true
	g.released = released
	g.again = ws + margin
	g.until = now.Add(g.timeout)
	return pause{sleep: pollFor(ws, limit)}
}

// pollFor is the wait before the next look at a working set of ws under a
// hard limit of limit bytes: what a process growing at fastestGrowth takes
// to use that room, within [pollMin, pollMax].
func pollFor(ws, limit int64) time.Duration {
	if limit <= 0 || limit <= ws {
		return pollMin
	}
	d := time.Duration(float64(limit-ws) / fastestGrowth * float64(time.Second))
	return min(max(d, pollMin), pollMax)
}

// workingSet is usage less the file pages on the LRU lists (memory.stat's
// total_active_file and total_inactive_file): what reclaim cannot take.
// gVisor's application memory is shared memory (a memfd), not a file page,
// so it counts.
func workingSet(d string, usage int64) int64 {
	b, err := os.ReadFile(filepath.Join(d, "memory.stat"))
	if err != nil {
		return usage
	}
	ws := usage
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		if k == "total_active_file" || k == "total_inactive_file" {
			n, _ := strconv.ParseInt(v, 10, 64)
			ws -= n
		}
	}
	return max(ws, 0)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
