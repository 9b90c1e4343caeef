// Package cgroup puts a sandbox's host processes (a QEMU VM) into a cgroup
// of their own under the parent every sandbox shares (space/<id>), with a
// CPU quota, a memory limit, a pid limit and a CPU weight, on cgroup v1
// (one hierarchy per controller) or v2 (the unified hierarchy).
//
// gVisor sandboxes get the same layout from runsc (internal/driver/gvisor
// passes the limits in the OCI spec) and Firecracker from its jailer
// (--parent-cgroup); this package is for drivers that start a plain
// process. The parent's weight is set once (SetParentShares): every
// sandbox together competes with one host process at that weight, so the
// control plane is served first.
package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Parent is the cgroup all sandboxes live under.
const Parent = "space"

// Shares of a sandbox's cgroup (v1 cpu.shares; v2 cpu.weight is scaled).
const (
	LowShares    = 2    // a pooled sandbox waiting to be claimed
	NormalShares = 1024 // a sandbox in use
)

// Root is where the cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// DefaultParentShares is the parent's CPU weight the drivers set unless
// configured otherwise: a quarter of one host process at nice 0, so the
// control plane is served first when it needs the CPU.
const DefaultParentShares = 256

// Limits are what one sandbox may use.
type Limits struct {
	CPUs     int  // CFS quota of this many cores (0: no quota)
	MemoryMB int  // hard memory limit (0: none)
	Pids     int  // most tasks (0: no limit)
	Low      bool // start at LowShares (Prioritize raises it)
}

// Unified reports whether the host runs cgroup v2 only (looked up once).
var Unified = sync.OnceValue(func() bool {
	_, err := os.Stat(filepath.Join(Root, "cgroup.controllers"))
	return err == nil
})

// v1Controllers are the hierarchies a sandbox joins on cgroup v1; cpuacct
// (accounting only) may share a mount with cpu.
var v1Controllers = []string{"cpu", "cpuacct", "memory", "pids"}

// dirs returns the sandbox's cgroup directories that exist or would be
// made: one per mounted v1 controller, or the v2 one.
func dirs(id string) []string {
	if Unified() {
		return []string{filepath.Join(Root, Parent, id)}
	}
	var out []string
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		base := filepath.Join(Root, c)
		real, err := filepath.EvalSymlinks(base) // cpu and cpuacct may be one mount
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		out = append(out, filepath.Join(base, Parent, id))
	}
	return out
}

// checkID refuses an id that is not one path element, or that holds a
// glob metacharacter: Remove passes the id to filepath.Glob, where "*"
// would name every sandbox's cgroups.
func checkID(id string) error {
	if id == "" || strings.ContainsAny(id, "/\x00*?[\\") || id == "." || id == ".." {
		return fmt.Errorf("cgroup: bad sandbox id %q", id)
	}
	return nil
}

// Start makes the sandbox's cgroup(s) with lim and starts cmd inside them,
// so that the process is limited from its first instruction: moved in
// after it started, what it allocated or spawned until then stayed
// charged to the server's cgroup (a VM restoring a 16 GiB checkpoint, a
// pooled VM booting at full CPU share). On cgroup v2 the child is cloned
// into the cgroup (CLONE_INTO_CGROUP); v1 moves single threads, so the
// fork happens on an OS thread moved into the cgroups first, which ends
// with the goroutine that locked it (it never serves the server again).
// On an error the cgroups made are removed and cmd was not started.
func Start(id string, cmd *exec.Cmd, lim Limits) (err error) {
	ds, err := prepare(id, lim)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = Remove(id)
		}
	}()
	if Unified() {
		f, err := os.Open(ds[0])
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		defer f.Close()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(f.Fd())
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			// The main thread: the process's memory is charged by it (the
			// mm's owner), and were it not moved back it would park in the
			// sandbox's cgroup for good. This goroutine keeps it locked
			// while another one forks from some other thread.
			inner := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				inner <- startOnThread(ds, cmd)
			}()
			errc <- <-inner
			runtime.UnlockOSThread()
			return
		}
		errc <- startOnThread(ds, cmd)
	}()
	return <-errc
}

// startOnThread starts cmd from the calling goroutine's locked OS thread
// moved into the cgroup directories ds (v1: one per hierarchy), then moves
// the thread back where it was and unlocks it. A thread that cannot be
// moved back stays locked, so it ends with its goroutine (Start never
// forks from the main thread, which Go would park instead).
func startOnThread(ds []string, cmd *exec.Cmd) error {
	tid := strconv.Itoa(syscall.Gettid())
	var back []string
	for _, d := range ds {
		ctl := filepath.Base(filepath.Dir(filepath.Dir(d)))
		cur, err := threadCgroup(ctl)
		if err != nil {
			runtime.UnlockOSThread()
			return err
		}
		back = append(back, filepath.Join(Root, ctl, cur))
	}
	moved := 0
	err := func() error {
		for _, d := range ds {
			if err := write(d, "tasks", tid); err != nil {
				return err
			}
			moved++
		}
		return cmd.Start()
	}()
	for _, o := range back[:moved] {
		if berr := write(o, "tasks", tid); berr != nil {
			if err == nil && cmd.Process != nil {
				return nil // started; only this thread is lost
			}
			return errors.Join(err, berr)
		}
	}
	runtime.UnlockOSThread()
	return err
}

// threadCgroup is the calling thread's cgroup path in the v1 hierarchy of
// controller.
func threadCgroup(controller string) (string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("cgroup: this thread has no %q cgroup", controller)
}

// prepare makes the sandbox's cgroup(s) with lim (removed again on an
// error) and returns their directories.
func prepare(id string, lim Limits) (ds []string, err error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	ds = dirs(id)
	if len(ds) == 0 {
		return nil, fmt.Errorf("cgroup: no cgroup hierarchy under %s", Root)
	}
	defer func() {
		if err != nil {
			_ = Remove(id)
		}
	}()
	if Unified() {
		return ds, prepareV2(ds[0], lim)
	}
	for _, d := range ds {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		if err := limitV1(d, lim); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// Files are the interface files and values that apply lim, in the order
// they must be written (memory before memory+swap), for cgroup v1 or the
// unified hierarchy. The v1 file names start with their controller.
func (lim Limits) Files(unified bool) [][2]string {
	shares := NormalShares
	if lim.Low {
		shares = LowShares
	}
	var w [][2]string
	if unified {
		w = append(w, [2]string{"cpu.weight", strconv.Itoa(weightOf(shares))})
		if lim.CPUs > 0 {
			w = append(w, [2]string{"cpu.max", fmt.Sprintf("%d 100000", lim.CPUs*100000)})
		}
		if lim.MemoryMB > 0 {
			w = append(w, [2]string{"memory.max", strconv.FormatInt(int64(lim.MemoryMB)<<20, 10)},
				[2]string{"memory.swap.max", "0"})
		}
	} else {
		w = append(w, [2]string{"cpu.shares", strconv.Itoa(shares)})
		if lim.CPUs > 0 {
			w = append(w, [2]string{"cpu.cfs_period_us", "100000"}, [2]string{"cpu.cfs_quota_us", strconv.Itoa(lim.CPUs * 100000)})
		}
		if lim.MemoryMB > 0 {
			b := strconv.FormatInt(int64(lim.MemoryMB)<<20, 10)
			// No swap beyond the limit either (where swap accounting
			// is on).
			w = append(w, [2]string{"memory.limit_in_bytes", b}, [2]string{"memory.memsw.limit_in_bytes", b})
		}
	}
	if lim.Pids > 0 {
		w = append(w, [2]string{"pids.max", strconv.Itoa(lim.Pids)})
	}
	return w
}

// optional are files that exist only with some kernel options (swap
// accounting): skipped where missing.
var optional = map[string]bool{"memory.memsw.limit_in_bytes": true, "memory.swap.max": true}

func writeFiles(d string, files [][2]string) error {
	for _, kv := range files {
		if optional[kv[0]] {
			if _, err := os.Stat(filepath.Join(d, kv[0])); err != nil {
				continue
			}
		}
		if err := write(d, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func limitV1(d string, lim Limits) error {
	controller := filepath.Base(filepath.Dir(filepath.Dir(d)))
	var mine [][2]string
	for _, kv := range lim.Files(false) {
		c, _, _ := strings.Cut(kv[0], ".")
		if slices.Contains(strings.Split(controller, ","), c) { // "cpu", or a joint mount "cpu,cpuacct"
			mine = append(mine, kv)
		}
	}
	return writeFiles(d, mine)
}

func prepareV2(d string, lim Limits) error {
	// The controllers must be enabled for the parent's children.
	parent := filepath.Dir(d)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	for _, p := range []string{Root, parent} {
		if err := write(p, "cgroup.subtree_control", "+cpu +memory +pids"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return writeFiles(d, lim.Files(true))
}

// weightOf converts v1 shares to a v2 cpu.weight (1024 ≙ 100).
func weightOf(shares int) int { return max(1, min(10000, shares*100/1024)) }

// SetParentShares gives the parent of all sandboxes its CPU weight,
// making it first if needed.
func SetParentShares(shares int) error {
	if Unified() {
		dir := filepath.Join(Root, Parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return write(dir, "cpu.weight", strconv.Itoa(weightOf(shares)))
	}
	dir := filepath.Join(Root, "cpu", Parent)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return write(dir, "cpu.shares", strconv.Itoa(max(2, shares)))
}

// Prioritize gives the sandbox's cgroup the normal CPU share.
func Prioritize(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if Unified() {
		return write(filepath.Join(Root, Parent, id), "cpu.weight", strconv.Itoa(weightOf(NormalShares)))
	}
	return write(filepath.Join(Root, "cpu", Parent, id), "cpu.shares", strconv.Itoa(NormalShares))
}

// Remove removes the sandbox's cgroups under every hierarchy, also those
// made by others (runsc makes one per v1 controller). One that still has
// processes cannot be removed (EBUSY): a killed process leaves it a moment
// later, so that is retried briefly. Missing cgroups are not an error.
func Remove(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ds, _ := filepath.Glob(filepath.Join(Root, "*", Parent, id))
	if Unified() {
		ds = append(ds, filepath.Join(Root, Parent, id))
	}
	var errs []error
	for _, d := range ds {
		var err error
		for try := 0; try < 50; try++ {
			if err = os.Remove(d); err == nil || errors.Is(err, fs.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Of reports the cgroup path pid is in for controller ("" on v2), as
// /proc/<pid>/cgroup says.
func Of(pid int, controller string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2], nil
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2], nil
			}
		}
	}
	return "", fmt.Errorf("cgroup: pid %d has no %q cgroup", pid, controller)
}

func write(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup: %s/%s = %s: %w", dir, file, value, err)
	}
	return nil
}

// RemoveOrphans removes the sandbox cgroups (space/<id> in any hierarchy)
// whose id match accepts, that hold no process and were made more than
// olderThan ago: what a sandbox whose runsc or VMM was killed without its
// cleanup leaves behind. Every server's sandboxes share space/, so a cgroup
// with a process, with a child cgroup, or made recently (a create places
// its process right after making it) is never touched. It returns the ids
// it removed.
func RemoveOrphans(olderThan time.Duration, match func(id string) bool) []string {
	ds, _ := filepath.Glob(filepath.Join(Root, "*", Parent, "*"))
	if Unified() {
		more, _ := filepath.Glob(filepath.Join(Root, Parent, "*"))
		ds = append(ds, more...)
	}
	byID := map[string][]string{}
	for _, d := range ds {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && match(filepath.Base(d)) {
			byID[filepath.Base(d)] = append(byID[filepath.Base(d)], d)
		}
	}
	cutoff := time.Now().Add(-olderThan)
	var removed []string
	for id, dd := range byID {
		if !slices.ContainsFunc(dd, func(d string) bool { return !orphanDir(d, cutoff) }) {
			for _, d := range dd {
				_ = os.Remove(d) // EBUSY if a process came meanwhile: it stays
			}
			removed = append(removed, id)
		}
	}
	slices.Sort(removed)
	return removed
}

// orphanDir reports whether cgroup d is older than cutoff, has no process
// and no child cgroup.
func orphanDir(d string, cutoff time.Time) bool {
	fi, err := os.Stat(d)
	if err != nil || fi.ModTime().After(cutoff) {
		return false
	}
	procs, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil || len(strings.TrimSpace(string(procs))) > 0 {
		return false
	}
	ents, err := os.ReadDir(d)
	if err != nil {
		return false
	}
	return !slices.ContainsFunc(ents, fs.DirEntry.IsDir)
}

// inSandbox reports whether pid is in a cgroup of sandbox id (or below).
func inSandbox(pid int, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	want := "/" + Parent + "/" + id
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[2] == want || strings.HasPrefix(parts[2], want+"/")) {
			return true
		}
	}
	return false
}

// Kill ends every process in the sandbox's cgroups and those below them
// (SIGKILL, again until none is left, for at most 5 s): the last resort
// when the runtime that started them cannot end them. It returns how many
// processes it signalled; an error when some remain. A sandbox without
// cgroups has nothing to kill.
func Kill(id string) (int, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	ds, _ := filepath.Glob(filepath.Join(Root, "*", Parent, id))
	if Unified() {
		ds = append(ds, filepath.Join(Root, Parent, id))
	}
	signalled := map[int]bool{}
	for deadline := time.Now().Add(5 * time.Second); ; {
		var pids []int
		for _, d := range ds {
			_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
				if err != nil || !e.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						pids = append(pids, pid)
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			return len(signalled), nil
		}
		if time.Now().After(deadline) {
			return len(signalled), fmt.Errorf("cgroup: %d processes of %s remain after SIGKILL", len(pids), id)
		}
		for _, pid := range pids {
			// Never this process (a thread of it may pass through a
			// sandbox's cgroup in Start), and only a process that is
			// still in this sandbox's cgroup (its pid may have been freed
			// and reused since the list was read).
			if pid == os.Getpid() || !inSandbox(pid, id) {
				continue
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			signalled[pid] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
}
