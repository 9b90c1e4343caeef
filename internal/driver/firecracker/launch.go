package firecracker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
)

// The VM's root directory is what Firecracker sees as its working
// directory: under the jailer the chroot (<StateDir>/<exec name>/<id>/root,
// the jailer's layout with --chroot-base-dir <StateDir>), without it
// <StateDir>/root. Every path given to Firecracker is relative to it, so a
// snapshot (which records drive and vsock paths) loads unchanged in any
// other VM's root: Firecracker requires the restored VM's resources "at the
// same relative paths".
const (
	apiSockName = "api.sock"    // the API socket
	vsockName   = "v.sock"      // the vsock device's unix socket (uds_path)
	kernelName  = "vmlinux"     // hard link to the cached kernel
	initrdName  = "initrd.cpio" // hard link to the cached initramfs
	diskName    = "rootfs.ext4" // the sandbox's own root disk
	stateName   = "vm.state"    // a snapshot's microVM state (restore)
	memoryName  = "memory"      // a snapshot's guest memory (restore)
)

// rootDir is the VM's root directory for an instance with state dir
// stateDir.
func (d *Driver) rootDir(stateDir, id string) string {
	if d.cfg.NoJailer {
		return filepath.Join(stateDir, "root")
	}
	return filepath.Join(stateDir, d.execName, id, "root")
}

// jailDir is the directory a failed start or a destroy removes: the whole
// jail (or the direct-mode root).
func (d *Driver) jailDir(stateDir, id string) string {
	if d.cfg.NoJailer {
		return filepath.Join(stateDir, "root")
	}
	return filepath.Join(stateDir, d.execName)
}

// apiSockArg is the --api-sock argument: inside the chroot under the
// jailer, relative to the working directory without it.
func (d *Driver) apiSockArg() string {
	if d.cfg.NoJailer {
		return apiSockName
	}
	return "/" + apiSockName
}

// launchTimeout bounds the wait for a new process's API socket.
const launchTimeout = 10 * time.Second

// launch starts Firecracker for inst (under the jailer unless NoJailer)
// and waits for its API. The process is in its own session, not tied to
// ctx: the VM outlives the call and the server. On error the process is
// killed; the caller removes the files.
func (i *Instance) launch(ctx context.Context) error {
	d := i.d
	console, err := os.OpenFile(i.consolePath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("firecracker: console log: %w", err)
	}
	defer console.Close()
	var cmd *exec.Cmd
	if d.cfg.NoJailer {
		cmd = exec.Command(d.cfg.Firecracker, "--id="+i.id, "--api-sock", d.apiSockArg())
		cmd.Dir = i.root
	} else {
		cmd = exec.Command(d.cfg.Jailer, d.jailerArgs(i.id, i.stateDir, i.machine.limits(i.low))...)
	}
	// Firecracker's serial console (the guest's ttyS0) and its own log go
	// to the console log; stdin is /dev/null.
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	if d.cfg.NoJailer {
		// A bare Firecracker starts inside its cgroup (see cgroup.Start);
		// the jailer puts it there itself.
		err = cgroup.Start(i.id, cmd, i.machine.limits(i.low))
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return fmt.Errorf("firecracker: start %s: %w", i.id, err)
	}
	var pid int
	if d.cfg.NoJailer {
		pid = cmd.Process.Pid
		go cmd.Wait() // reap it; Wait watches the pid, not this
	} else {
		// With --new-pid-ns the jailer clones Firecracker into a new pid
		// namespace, writes its pid into the jail and exits.
		if err := waitExit(ctx, cmd); err != nil {
			i.killPid(hostproc.ReadPid(i.pidPath()))
			return fmt.Errorf("firecracker: jailer for %s: %v: %s", i.id, err, hostproc.TailFile(i.consolePath(), 1500))
		}
		if pid = hostproc.ReadPid(i.pidPath()); pid <= 0 {
			return fmt.Errorf("firecracker: jailer for %s wrote no pid file: %s", i.id, hostproc.TailFile(i.consolePath(), 1500))
		}
	}
	i.mu.Lock()
	i.pid = pid
	i.mu.Unlock()
	if err := i.confine(pid); err != nil {
		i.killPid(pid)
		return err
	}
	if _, err := waitAPI(ctx, i.api(), launchTimeout, func() bool { return !hostproc.Alive(pid) }); err != nil {
		i.killPid(pid)
		return fmt.Errorf("firecracker: %s: %w (console: %s)", i.id, err, hostproc.TailFile(i.consolePath(), 1500))
	}
	// The console log (appended to) stays within 8 MiB while it runs.
	go hostproc.CapFile(i.consolePath(), 8<<20, 256<<10, 5*time.Second, func() bool {
		i.mu.Lock()
		pid, destroyed := i.pid, i.destroyed
		i.mu.Unlock()
		return !destroyed && hostproc.Alive(pid)
	})
	return nil
}

// confine makes sure Firecracker (pid) runs in the sandbox's cgroup
// (space/<id>) with its limits: the jailer put it there (--parent-cgroup,
// --cgroup), which is checked, never assumed (a VM outside its limits is
// not started); a bare process (NoJailer) was started there.
func (i *Instance) confine(pid int) error {
	if i.d.cfg.NoJailer {
		return nil // started in it (launch)
	}
	controller := "cpu"
	if i.d.cgroup2 {
		controller = ""
	}
	got, err := cgroup.Of(pid, controller)
	if want := "/" + cgroup.Parent + "/" + i.id; err != nil || got != want {
		return fmt.Errorf("firecracker: %s: the jailer left the VM in cgroup %q (%v), not %s", i.id, got, err, want)
	}
	return nil
}

// jailerArgs is the jailer's command line for instance id: the jail under
// stateDir, a new pid namespace, the cgroup space/<id> with lim,
// Firecracker's API socket at its root.
func (d *Driver) jailerArgs(id, stateDir string, lim cgroup.Limits) []string {
	args := []string{
		"--id", id,
		"--exec-file", d.cfg.Firecracker,
		"--uid", strconv.Itoa(d.cfg.UID),
		"--gid", strconv.Itoa(d.cfg.GID),
		"--chroot-base-dir", stateDir,
		"--new-pid-ns",
	}
	if d.cgroup2 {
		args = append(args, "--cgroup-version", "2")
	}
	args = append(args, "--parent-cgroup", cgroup.Parent)
	for _, kv := range lim.Files(d.cgroup2) {
		if kv[0] == "memory.memsw.limit_in_bytes" || kv[0] == "memory.swap.max" {
			continue // not on every kernel; the jailer fails on a missing file
		}
		args = append(args, "--cgroup", kv[0]+"="+kv[1])
	}
	return append(args, "--", "--api-sock", d.apiSockArg())
}

// waitExit waits for cmd to exit, killing it when ctx ends first.
func waitExit(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}

// killPid kills pid if it is this instance's Firecracker and waits (up to
// 10 s) for it to die.
func (i *Instance) killPid(pid int) error {
	if pid <= 0 || !i.ours(pid) {
		return nil
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for hostproc.Alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("firecracker: vm %s (pid %d) did not die", i.id, pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// ours reports whether pid is a live Firecracker of this instance: the
// jailer (and this driver, without it) passes --id=<id>, and ids are
// unique. It guards against pid reuse. "--id <id>" is accepted too.
func (i *Instance) ours(pid int) bool {
	if !hostproc.Alive(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	b = append([]byte{0}, b...)
	return bytes.Contains(b, []byte("\x00--id="+i.id+"\x00")) || bytes.Contains(b, []byte("\x00--id\x00"+i.id+"\x00"))
}

// prepareRoot creates the VM's root directory. Under the jailer the jailer
// itself chowns it to the VM's uid; files placed in it are chowned by
// place.
func (i *Instance) prepareRoot() error {
	if err := os.MkdirAll(i.root, 0o700); err != nil {
		return fmt.Errorf("firecracker: root dir: %w", err)
	}
	return nil
}

// linkIn hard-links src into the VM's root as name (copying when the
// files are on different filesystems). For files shared read-only between
// VMs (kernel, initramfs, a snapshot's memory): they must be readable by
// the jailed uid and are never written.
func (i *Instance) linkIn(ctx context.Context, src, name string) error {
	dst := filepath.Join(i.root, name)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	if err := copyFile(ctx, src, dst); err != nil {
		return err
	}
	return os.Chmod(dst, 0o644)
}

// copyIn copies src into the VM's root as name, as the VM's own writable
// file (reflinked where the filesystem can, holes kept), owned by the
// jailed uid.
func (i *Instance) copyIn(ctx context.Context, src, name string) error {
	dst := filepath.Join(i.root, name)
	if err := copyFile(ctx, src, dst); err != nil {
		return err
	}
	return i.own(dst, 0o600)
}

// own gives path to the VM's uid and gid (under the jailer) with mode.
func (i *Instance) own(path string, mode os.FileMode) error {
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	if i.d.cfg.NoJailer {
		return nil
	}
	if err := os.Lchown(path, i.d.cfg.UID, i.d.cfg.GID); err != nil {
		return fmt.Errorf("firecracker: chown %s: %w", filepath.Base(path), err)
	}
	return nil
}

// copyFile copies src to dst, sharing blocks where the filesystem can
// (reflink) and keeping holes.
func copyFile(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %v: %s", filepath.Base(src), err, bytes.TrimSpace(out))
	}
	return nil
}

// moveFile renames src to dst, copying across filesystems.
func moveFile(ctx context.Context, src, dst string) error {
	err := os.Rename(src, dst)
	if err == nil || !errors.Is(err, unix.EXDEV) {
		return err
	}
	if err := copyFile(ctx, src, dst); err != nil {
		return err
	}
	return os.Remove(src)
}

// notRunning is the error for an API call to a VM whose process is gone.
func (i *Instance) notRunning() error {
	return fmt.Errorf("firecracker: vm %s is not running (console: %s): %w", i.id, hostproc.TailFile(i.consolePath(), 1500), errdefs.ErrUnavailable)
}
