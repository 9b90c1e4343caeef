package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// VM init mode (--init): the agent is /init of the VM's initramfs and the
// kernel's PID 1. Before serving it does what an init does:
//
//  1. mounts /dev (devtmpfs), /proc and /sys;
//  2. loads the kernel modules shipped in the initramfs (/lib/modules/*.ko,
//     in name order, which the image builder made dependency order) with
//     finit_module: the virtio transport, block and console drivers;
//  3. mounts the root disk (space.root=, default /dev/vda, ext4, writable:
//     the host backs it with a per-sandbox copy-on-write overlay of the
//     shared template image), moves /dev, /proc, /sys into it, frees the
//     initramfs and switches root to it (mount --move + chroot);
//  4. mounts /dev/pts, /dev/shm, /tmp and /run, brings up loopback and
//     sets the hostname (space.hostname=).
//
// It stays PID 1 afterwards: it reaps every orphan (Options.ReapAll) and
// powers the VM off when it returns, so QEMU exits instead of the kernel
// panicking.

// vmInit prepares the guest for the agent. It runs once, as PID 1.
func vmInit(log *slog.Logger) error {
	start := time.Now()
	for _, m := range []struct{ src, dst, typ, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules("/lib/modules"); err != nil {
		return err
	}
	args := kernelArgs()
	rootDev := args["space.root"]
	if rootDev == "" {
		rootDev = "/dev/vda"
	}
	if err := waitFor(rootDev, 20*time.Second); err != nil {
		return err
	}
	if err := unix.Mount(rootDev, "/newroot", "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount root %s: %w", rootDev, err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		_ = os.MkdirAll("/newroot"+d, 0o755)
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	freeInitramfs("/newroot")
	if err := os.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	for _, m := range []struct {
		dst, typ string
		flags    uintptr
		data     string
		perm     os.FileMode
	}{
		{"/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755},
		{"/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
	} {
		_ = os.MkdirAll(m.dst, m.perm)
		if err := unix.Mount(m.typ, m.dst, m.typ, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	for name, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		_ = os.Symlink(target, name)
	}
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	if h := args["space.hostname"]; h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			log.Warn("set hostname", "err", err)
		}
	}
	if err := loopbackUp(); err != nil {
		log.Warn("loopback", "err", err)
	}
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("HOME", "/root")
	log.Info("vm init done", "root", rootDev, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// loadModules loads every *.ko in dir in name order.
func loadModules(dir string) error {
	names, _ := filepath.Glob(filepath.Join(dir, "*.ko"))
	sort.Strings(names)
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", filepath.Base(n), err)
		}
	}
	return nil
}

// kernelArgs returns the key=value words of /proc/cmdline.
func kernelArgs() map[string]string {
	b, _ := os.ReadFile("/proc/cmdline")
	out := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			out[k] = v
		}
	}
	return out
}

// waitFor waits for a device node to appear (drivers probe asynchronously).
func waitFor(path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// freeInitramfs removes the initramfs's files (keep is the new root's
// mount point) so their memory returns to the guest. The running agent's
// binary stays mapped; only its name goes.
func freeInitramfs(keep string) {
	var root unix.Stat_t
	if unix.Stat("/", &root) != nil {
		return
	}
	entries, _ := os.ReadDir("/")
	for _, e := range entries {
		p := "/" + e.Name()
		var st unix.Stat_t
		if p == keep || unix.Lstat(p, &st) != nil || st.Dev != root.Dev {
			continue
		}
		_ = os.RemoveAll(p)
	}
}

// loopbackUp sets IFF_UP on lo.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// powerOff ends the VM (PID 1 must never simply exit: the kernel panics).
func powerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
