package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
// cgroup is removed. On cgroup v1 the kernel signals an eventfd when the
// usage crosses the threshold (memory thresholds of cgroup.event_control);
// only while the usage is above it is the working set checked every 50 ms
// (page cache can hold the usage up while a process grows), 250 ms after
// a call to fn, so that the memory it freed shows. The eventfd waits in
// Go's poller, not on a thread. On cgroup v2 it returns ErrNoMemoryWatch.
func WatchMemory(ctx context.Context, id string, threshold int64, fn func(workingSet int64)) error {
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
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		usage.Close()
		return fmt.Errorf("cgroup: eventfd: %w", err)
	}
	ev := os.NewFile(uintptr(efd), "eventfd") // non-blocking: read in the poller
	if err := write(d, "cgroup.event_control", fmt.Sprintf("%d %d %d", efd, usage.Fd(), threshold)); err != nil {
		ev.Close()
		usage.Close()
		return err
	}
	go func() {
		defer usage.Close()
		defer ev.Close()
		stop := context.AfterFunc(ctx, func() { _ = ev.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
		buf := make([]byte, 8)
		for {
			// Above the threshold already (at registration, or after the
			// eventfd fired): watch the working set until the usage drops.
			for {
				u, err := readInt(filepath.Join(d, "memory.usage_in_bytes"))
				if err != nil {
					return // removed
				}
				if u < threshold {
					break // wait for the next crossing
				}
				wait := 50 * time.Millisecond
				if ws := workingSet(d, u); ws >= threshold {
					fn(ws)
					wait = 250 * time.Millisecond
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			// Signalled on every crossing, down as well as up, and when
			// the cgroup is removed.
			if _, err := ev.Read(buf); err != nil {
				return // ctx ended
			}
		}
	}()
	return nil
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
