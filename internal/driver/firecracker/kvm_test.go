package firecracker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestKVMVerdict(t *testing.T) {
	devErr := errors.New("open /dev/kvm: no such file or directory")
	bootErr := errors.New("kvm boot probe: no guest panic within 10s")
	for _, c := range []struct {
		dev, boot, want error
	}{
		{nil, nil, nil},
		{devErr, nil, devErr},
		// /dev/kvm opens but a guest does not boot (nested PVM).
		{nil, bootErr, bootErr},
		{devErr, bootErr, devErr},
	} {
		if got := kvmVerdict(c.dev, c.boot); got != c.want {
			t.Errorf("kvmVerdict(%v, %v) = %v, want %v", c.dev, c.boot, got, c.want)
		}
	}
}

func TestKVMDevice(t *testing.T) {
	if err := kvmDevice(filepath.Join(t.TempDir(), "kvm")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing device: %v", err)
	}
	// A file that is not a KVM device fails the API version ioctl.
	f := filepath.Join(t.TempDir(), "notkvm")
	os.WriteFile(f, nil, 0o600)
	if err := kvmDevice(f); err == nil || !strings.Contains(err.Error(), "KVM_GET_API_VERSION") {
		t.Errorf("not a device: %v", err)
	}
	t.Logf("this host's /dev/kvm: %v", kvmDevice("/dev/kvm"))
}

// TestProbeBoot runs the boot probe's process path against the test
// double, which answers --no-api --config-file like a booted kernel.
func TestProbeBoot(t *testing.T) {
	fc, _, _ := fakeEnvFor(t)
	if err := probeBoot(t.Context(), fc, "/boot/vmlinux-none"); err != nil {
		t.Errorf("probe with a panicking guest: %v", err)
	}
	// A binary that exits without a guest panic is a failed probe.
	if err := probeBoot(t.Context(), "/bin/true", "/boot/vmlinux-none"); err == nil || !strings.Contains(err.Error(), "without a guest panic") {
		t.Errorf("probe with /bin/true: %v", err)
	}
}

func TestVersions(t *testing.T) {
	fc, jailer, _ := fakeEnvFor(t)
	if v, err := binaryVersion(t.Context(), fc, "Firecracker"); err != nil || v != fakeVersion {
		t.Errorf("firecracker version %q, %v", v, err)
	}
	if v, err := binaryVersion(t.Context(), jailer, "Jailer"); err != nil || v != fakeVersion {
		t.Errorf("jailer version %q, %v", v, err)
	}
	if _, err := binaryVersion(t.Context(), "/bin/echo", "Firecracker"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("echo as firecracker: %v", err)
	}
	for v, want := range map[string]bool{"1.8.0": true, "1.10.1": true, "2.0.0": true, "1.7.9": false, "0.25.2": false, "x": false} {
		if got := versionAtLeast(v, minVersion); got != want {
			t.Errorf("versionAtLeast(%s) = %v", v, got)
		}
	}
}

func TestNewWithoutFirecracker(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := New(t.Context(), Config{CacheDir: t.TempDir()})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "firecracker not found") {
		t.Errorf("New without firecracker: %v", err)
	}
	_, err = New(t.Context(), Config{Firecracker: "/bin/true", CacheDir: t.TempDir()})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "contain \"firecracker\"") {
		t.Errorf("New with a binary the jailer refuses: %v", err)
	}
}

func TestBootArgs(t *testing.T) {
	a := bootArgs("box")
	for _, want := range []string{"console=ttyS0", "reboot=k", "panic=-1", "space.hostname=box", "space.root=/dev/vda", "rdinit=/init"} {
		if !strings.Contains(a, want) {
			t.Errorf("boot args lack %s: %q", want, a)
		}
	}
	if !strings.HasSuffix(a, " -- --init --vsock 1024") {
		t.Errorf("agent arguments: %q", a)
	}
}

func TestJailerArgs(t *testing.T) {
	d := newDriver(Config{Firecracker: "/opt/fc/firecracker-v1.10.1", Jailer: "/opt/fc/jailer", UID: 123, GID: 100}, "1.10.1", "", "")
	d.cgroup2 = true
	lim := machine{VCPU: 2, MemoryMB: 512}.limits(true)
	got := strings.Join(d.jailerArgs("sb-abc", "/var/lib/space/sandboxes/sb-abc", lim), " ")
	want := "--id sb-abc --exec-file /opt/fc/firecracker-v1.10.1 --uid 123 --gid 100 " +
		"--chroot-base-dir /var/lib/space/sandboxes/sb-abc --new-pid-ns --cgroup-version 2 --parent-cgroup space " +
		"--cgroup cpu.weight=1 --cgroup cpu.max=200000 100000 --cgroup memory.max=939524096 --cgroup pids.max=256 -- --api-sock /api.sock"
	if got != want {
		t.Errorf("jailer args\n got %s\nwant %s", got, want)
	}
	d.cgroup2 = false
	got = strings.Join(d.jailerArgs("sb-abc", "/s", machine{VCPU: 1, MemoryMB: 256}.limits(false)), " ")
	if !strings.Contains(got, "--parent-cgroup space --cgroup cpu.shares=1024 --cgroup cpu.cfs_period_us=100000 --cgroup cpu.cfs_quota_us=100000 --cgroup memory.limit_in_bytes=603979776 --cgroup pids.max=256 --") {
		t.Errorf("cgroup v1 jailer args: %s", got)
	}
	if r := d.rootDir("/s/sb-abc", "sb-abc"); r != "/s/sb-abc/firecracker-v1.10.1/sb-abc/root" {
		t.Errorf("jail root %s", r)
	}
	// Zero uid/gid never means root under the jailer.
	if d := newDriver(Config{}, "", "", ""); d.cfg.UID != 65534 || d.cfg.GID != 65534 {
		t.Errorf("default uid:gid %d:%d", d.cfg.UID, d.cfg.GID)
	}
}

func TestCapabilities(t *testing.T) {
	c := (&Driver{}).Capabilities()
	for _, f := range []string{"pause", "checkpoint", "restore", "fork"} {
		if !c.Has(f) {
			t.Errorf("missing %s", f)
		}
	}
	if c.Has("files_snapshot") || c.Isolation != "vm" || c.Accelerator != "kvm" {
		t.Errorf("capabilities %+v", c)
	}
}
