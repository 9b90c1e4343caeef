// Package hostproc holds what the drivers need to know about host
// processes they started but do not necessarily parent (a daemonized QEMU,
// a jailed Firecracker, runsc's sandbox process, or any of them after a
// server restart): whether one is alive, waiting for its exit, its pid
// file and the tail of its log.
package hostproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/driver"
)

// Alive reports whether pid is a live process (not gone, not a zombie).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// WaitExit returns once pid has exited (a zombie nobody reaps counts; a
// pid that is already gone returns at once), or ctx's error. It waits on a
// non-blocking pidfd in Go's poller, so a server watching hundreds of
// sandboxes parks no OS thread per process.
func WaitExit(ctx context.Context, pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n > 0 // readable: the process exited
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("wait on pidfd of %d: %w", pid, err)
	}
	return nil
}

// WaitInstance implements driver.Instance.Wait for an instance whose host
// process may not have started yet: state reports its pid (0 until known)
// and whether the instance was destroyed. The exit is "destroyed" when it
// was, "exited" otherwise.
func WaitInstance(ctx context.Context, state func() (pid int, destroyed bool)) (driver.ExitStatus, error) {
	var pid int
	for {
		p, destroyed := state()
		if destroyed && p <= 0 {
			return driver.ExitStatus{Reason: "destroyed"}, nil
		}
		if p > 0 {
			pid = p
			break
		}
		select { // not started yet
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return driver.ExitStatus{}, ctx.Err()
		}
	}
	if err := WaitExit(ctx, pid); err != nil {
		return driver.ExitStatus{}, err
	}
	if _, destroyed := state(); destroyed {
		return driver.ExitStatus{Reason: "destroyed"}, nil
	}
	return driver.ExitStatus{Reason: "exited"}, nil
}

// ReadPid reads a pid file (0 when it is missing or malformed).
func ReadPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// TailFile returns the last n bytes of a file, trimmed, for error
// messages ("" when it cannot be read).
func TailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, 0); err != nil {
			return ""
		}
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	return strings.TrimSpace(string(b[:k]))
}

// CapFile keeps a log a VMM appends to (a guest's serial console) from
// filling the host's disk: every interval while alive reports true, a file
// grown past max is cut to its last keep bytes, after a marker line. The
// writer must append (O_APPEND), so its next write lands at the new end;
// what it writes while the file is being cut may be lost. Without it, a
// guest writing to its console without end (cat /dev/zero > /dev/ttyS0)
// filled the data directory of every sandbox and the server.
func CapFile(path string, max, keep int64, interval time.Duration, alive func() bool) {
	for alive() {
		time.Sleep(interval)
		fi, err := os.Stat(path)
		if err != nil || fi.Size() <= max {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		tail := make([]byte, keep)
		n, _ := f.ReadAt(tail, fi.Size()-keep)
		f.Close()
		if err := os.Truncate(path, 0); err != nil {
			continue
		}
		w, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			continue
		}
		fmt.Fprintf(w, "\n[space: console cut at %d bytes; its last %d follow]\n", fi.Size(), n)
		_, _ = w.Write(tail[:n])
		w.Close()
	}
}
