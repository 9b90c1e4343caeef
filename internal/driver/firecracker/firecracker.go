// Package firecracker runs each sandbox as a Firecracker microVM: its own
// guest kernel (Debian's cloud kernel, the vmlinux internal/vmimage
// extracts), no NIC, a root disk that is the sandbox's own copy of the
// template's raw ext4 image (reflinked where the filesystem can), and
// space-agent as PID 1 (the initramfs's /init, in --init mode).
//
// Firecracker is driven through its HTTP API on a unix socket (api.go): the
// boot is a fixed sequence of PUTs (boot source, drive, machine config,
// vsock, InstanceStart); pause and resume are PATCH /vm; a checkpoint is a
// Full snapshot of the paused VM plus a copy of its disk, a restore a fresh
// process loading it (checkpoint.go). Every path Firecracker sees is
// relative to its working directory, so snapshots load in any VM's
// directory.
//
// Firecracker runs under its jailer (chroot in the sandbox's state
// directory, new mount and pid namespaces, an unprivileged uid) unless
// Config.NoJailer asks for a bare process, for development. Either way it
// runs in its own session, not tied to the server: a server restart leaves
// VMs running and Recover re-attaches by pid and API socket.
//
// The agent speaks the usual protocol over virtio-vsock: it listens on
// vsock port AgentPort in the guest; the host connects to Firecracker's
// vsock unix socket and asks for that port (vsock.go). Firecracker needs a
// working KVM; New probes it by booting the guest kernel (kvm.go).
package firecracker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/vmimage"
)

// Name is the driver's registry name.
const Name = "firecracker"

// minVersion is the oldest Firecracker this driver supports: 1.8 added
// ACPI on x86_64, through which the stock guest kernel finds the virtio
// devices (it lacks VIRTIO_MMIO_CMDLINE_DEVICES).
var minVersion = [2]int{1, 8}

// Config configures the Firecracker driver.
type Config struct {
	// Firecracker is the firecracker binary (looked up on PATH when empty).
	// Its file name must contain "firecracker" (the jailer insists).
	Firecracker string
	// Jailer is the jailer binary of the same release (looked up on PATH
	// when empty). Unused with NoJailer.
	Jailer string
	// NoJailer runs firecracker directly as the server's user: no chroot,
	// no namespaces, no privilege drop. For development only.
	NoJailer bool
	// UID and GID the jailed firecracker runs as. Zero means 65534
	// (nobody/nogroup): under the jailer firecracker never runs as root.
	UID, GID int
	// CacheDir holds the extracted kernel and the initramfs builds
	// (internal/vmimage), shared with the qemu driver.
	CacheDir string
	Log      *slog.Logger
}

// Driver implements driver.Driver with Firecracker microVMs.
type Driver struct {
	cfg        Config
	log        *slog.Logger
	version    string // firecracker's, e.g. "1.10.1"
	execName   string // the firecracker binary's file name (the jail's directory)
	kernel     string // uncompressed vmlinux
	modulesDir string
	cgroup2    bool // the host runs the unified cgroup hierarchy
	// initrd returns the initramfs for an agent binary (initramfs.go;
	// replaced in tests, which have no guest kernel modules).
	initrd func(ctx context.Context, agentPath string) (string, error)
}

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.Restorer        = (*Driver)(nil)
	_ driver.HandleDestroyer = (*Driver)(nil)
	_ driver.Instance        = (*Instance)(nil)
	_ driver.Detacher        = (*Instance)(nil)
	_ driver.Checkpointer    = (*Instance)(nil)
	_ driver.Prioritizer     = (*Instance)(nil)
)

// New finds firecracker (and the jailer), checks their versions, finds the
// guest kernel and probes KVM by booting it. Errors: errdefs.ErrUnavailable
// naming what is missing, or why KVM is not usable on this host.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if err := resolveBinaries(&cfg); err != nil {
		return nil, err
	}
	if cfg.CacheDir == "" {
		return nil, errdefs.InvalidArgument("firecracker: no cache dir configured")
	}
	version, err := binaryVersion(ctx, cfg.Firecracker, "Firecracker")
	if err != nil {
		return nil, err
	}
	if !versionAtLeast(version, minVersion) {
		return nil, errdefs.Unavailable("firecracker: version %s is too old (need %d.%d or newer)", version, minVersion[0], minVersion[1])
	}
	if !cfg.NoJailer {
		jv, err := binaryVersion(ctx, cfg.Jailer, "Jailer")
		if err != nil {
			return nil, err
		}
		if jv != version {
			return nil, errdefs.Unavailable("firecracker: jailer %s does not match firecracker %s (use both from one release)", jv, version)
		}
	}
	kernel, modulesDir, err := vmimage.Kernel(ctx, cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	if err := probeKVM(ctx, cfg.Firecracker, kernel); err != nil {
		return nil, errdefs.Unavailable("firecracker: no usable KVM on this host: %v", err)
	}
	d := newDriver(cfg, version, kernel, modulesDir)
	d.log.Info("firecracker driver ready", "version", version, "jailer", !cfg.NoJailer)
	return d, nil
}

// newDriver builds the driver from checked parts.
func newDriver(cfg Config, version, kernel, modulesDir string) *Driver {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.UID == 0 && cfg.GID == 0 {
		cfg.UID, cfg.GID = 65534, 65534
	}
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	d := &Driver{
		cfg: cfg, log: cfg.Log.With("driver", Name), version: version,
		execName: filepath.Base(cfg.Firecracker), kernel: kernel, modulesDir: modulesDir,
		cgroup2: err == nil,
	}
	d.initrd = d.initramfs
	return d
}

// resolveBinaries fills in and checks the binaries' absolute paths (the
// jailer wants an absolute exec file whose name contains "firecracker").
func resolveBinaries(cfg *Config) error {
	find := func(path *string, name, what string) error {
		if *path == "" {
			p, err := exec.LookPath(name)
			if err != nil {
				return errdefs.Unavailable("firecracker: %s not found on PATH: install it from a Firecracker release (github.com/firecracker-microvm/firecracker/releases)", name)
			}
			*path = p
		}
		abs, err := filepath.Abs(*path)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			return errdefs.Unavailable("firecracker: %s %s: %v", what, *path, err)
		}
		*path = abs
		return nil
	}
	if err := find(&cfg.Firecracker, "firecracker", "binary"); err != nil {
		return err
	}
	if cfg.NoJailer {
		return nil
	}
	if !strings.Contains(filepath.Base(cfg.Firecracker), "firecracker") {
		return errdefs.InvalidArgument("firecracker: the jailer needs the binary's file name to contain \"firecracker\", got %s", cfg.Firecracker)
	}
	return find(&cfg.Jailer, "jailer", "jailer")
}

var versionRE = regexp.MustCompile(`\bv?(\d+)\.(\d+)\.(\d+)\b`)

// binaryVersion runs `bin --version` and returns the version in its first
// line ("Firecracker v1.10.1", "Jailer v1.10.1").
func binaryVersion(ctx context.Context, bin, app string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", errdefs.Unavailable("firecracker: %s --version: %v: %s", bin, err, strings.TrimSpace(string(out)))
	}
	first, _, _ := strings.Cut(string(out), "\n")
	m := versionRE.FindStringSubmatch(first)
	if m == nil || !strings.Contains(first, app) {
		return "", errdefs.Unavailable("firecracker: %s --version: unexpected output %q", bin, strings.TrimSpace(first))
	}
	return m[1] + "." + m[2] + "." + m[3], nil
}

// versionAtLeast reports whether version (major.minor.patch) is min or newer.
func versionAtLeast(version string, min [2]int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > min[0] || major == min[0] && minor >= min[1]
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// minMemoryMB is the least memory a VM boots with (its kernel and agent).
const minMemoryMB = 128

// MinMemoryMB implements driver.MemoryFloor.
func (d *Driver) MinMemoryMB() int { return minMemoryMB }

// Version is the Firecracker version in use.
func (d *Driver) Version() string { return d.version }

// Capabilities implements driver.Driver: pause/resume, checkpoint,
// restore and fork (many restores of one checkpoint); no files snapshot
// (the writable disk cannot be exported while the VM runs).
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Isolation:   "vm",
		Features:    []string{driver.CapPause, driver.CapCheckpoint, driver.CapRestore, driver.CapFork},
		Accelerator: "kvm",
	}
}

// idRE is what both the sandbox service and the jailer accept as an id
// (the jailer: alphanumerics and hyphens, at most 64).
var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]{0,63}$`)

// hostnameRE is a guest hostname (one label).
var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)

// Firecracker's vCPU range (machine-config vcpu_count).
const maxVCPU = 32

// handleData is what Recover needs beyond the id.
type handleData struct {
	StateDir string `json:"state_dir"`
	Root     string `json:"root"`
	Pid      int    `json:"pid,omitempty"`
}

// machine is the VM's shape as booted. A checkpoint stores it next to the
// snapshot (Firecracker's state file holds the rest).
type machine struct {
	VCPU     int    `json:"vcpu"`
	MemoryMB int    `json:"memory_mb"`
	BootArgs string `json:"boot_args"`
	// Version is the Firecracker that booted (or restored) the VM.
	Version string `json:"firecracker_version"`
}

// limits are the cgroup limits of a VM: its vCPUs as a CPU quota, guest
// memory plus the VMM's own as a hard limit, a pid limit.
func (m machine) limits(low bool) cgroup.Limits {
	return cgroup.Limits{CPUs: m.VCPU, MemoryMB: m.MemoryMB + 256 + m.MemoryMB/4, Pids: 256, Low: low}
}

func (d *Driver) normalize(spec *driver.Spec) error {
	if !idRE.MatchString(spec.ID) {
		return errdefs.InvalidArgument("firecracker: invalid sandbox id %q", spec.ID)
	}
	if spec.StateDir == "" || !filepath.IsAbs(spec.StateDir) {
		return errdefs.InvalidArgument("firecracker: state dir must be an absolute path")
	}
	if spec.RootfsKind != "raw" {
		return errdefs.InvalidArgument("firecracker: rootfs must be a raw disk image, got kind %q", spec.RootfsKind)
	}
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.Mode().IsRegular() {
		return errdefs.InvalidArgument("firecracker: rootfs image %s: %v", spec.Rootfs, err)
	}
	if _, err := os.Stat(spec.AgentPath); err != nil {
		return errdefs.Unavailable("firecracker: agent binary: %v", err)
	}
	if spec.VCPU <= 0 {
		spec.VCPU = 1
	}
	if spec.VCPU > maxVCPU {
		return errdefs.InvalidArgument("firecracker: %d vCPUs is more than Firecracker's %d", spec.VCPU, maxVCPU)
	}
	if spec.MemoryMB <= 0 {
		spec.MemoryMB = 512
	}
	if spec.MemoryMB < minMemoryMB {
		return errdefs.InvalidArgument("firecracker: %d MiB of memory is too little for a VM (minimum %d)", spec.MemoryMB, minMemoryMB)
	}
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
	if !hostnameRE.MatchString(spec.Hostname) {
		return errdefs.InvalidArgument("firecracker: invalid hostname %q", spec.Hostname)
	}
	return nil
}

// Create implements driver.Driver: the state dir and the VM's root
// directory holding hard links to the kernel and initramfs (cached) and the
// sandbox's own copy of the template image. Firecracker starts in Start.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Instance, err error) {
	if err := d.normalize(&spec); err != nil {
		return nil, err
	}
	inst := d.newInstance(spec.ID, spec.StateDir)
	inst.low = spec.LowPriority
	defer func() {
		if err != nil {
			_ = inst.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("firecracker: state dir: %w", err)
	}
	initrd, err := d.initrd(ctx, spec.AgentPath)
	if err != nil {
		return nil, err
	}
	if err := inst.prepareRoot(); err != nil {
		return nil, err
	}
	if err := inst.linkIn(ctx, d.kernel, kernelName); err != nil {
		return nil, fmt.Errorf("firecracker: kernel: %w", err)
	}
	if err := inst.linkIn(ctx, initrd, initrdName); err != nil {
		return nil, fmt.Errorf("firecracker: initramfs: %w", err)
	}
	if err := inst.copyIn(ctx, spec.Rootfs, diskName); err != nil {
		return nil, fmt.Errorf("firecracker: root disk: %w", err)
	}
	inst.machine = machine{VCPU: spec.VCPU, MemoryMB: spec.MemoryMB, BootArgs: bootArgs(spec.Hostname), Version: d.version}
	if err := writeJSON(inst.machinePath(), inst.machine); err != nil {
		return nil, err
	}
	return inst, nil
}

// bootArgs is the guest kernel's command line: trimmed for a fast boot,
// the console on the serial port (the console log on the host), a guest
// panic rebooting (which ends Firecracker), the agent as init listening on
// vsock.
func bootArgs(hostname string) string {
	args := []string{
		"console=ttyS0", "quiet", "loglevel=4", "reboot=k", "panic=-1", "pci=off",
		"tsc=reliable", "no_timer_check", "mitigations=off", "cryptomgr.notests",
		"random.trust_cpu=on", "8250.nr_uarts=1",
		"i8042.noaux", "i8042.nomux", "i8042.nopnp", "i8042.dumbkbd",
		"rdinit=/init", "space.root=/dev/vda", "space.hostname=" + hostname,
	}
	return strings.Join(append(args, "--", "--init", "--vsock", strconv.Itoa(AgentPort)), " ")
}

// bootSequence is the API calls that configure and boot a created VM, in
// order. Paths are relative to the VM's root directory.
func bootSequence(m machine) []apiCall {
	return []apiCall{
		{"PUT", "/boot-source", bootSource{KernelImagePath: kernelName, InitrdPath: initrdName, BootArgs: m.BootArgs}},
		{"PUT", "/drives/rootfs", drive{DriveID: "rootfs", PathOnHost: diskName, IsRootDevice: false, IsReadOnly: false}},
		{"PUT", "/machine-config", machineConfig{VCPUCount: m.VCPU, MemSizeMiB: m.MemoryMB}},
		{"PUT", "/vsock", vsockDevice{GuestCID: guestCID, UDSPath: vsockName}},
		{"PUT", "/actions", instanceAction{ActionType: actionInstanceStart}},
	}
}

// Recover implements driver.Driver: the Firecracker process named by the
// handle must still run (and be this sandbox's: its command line carries
// the id) and its API must report a booted VM.
func (d *Driver) Recover(ctx context.Context, h driver.Handle) (driver.Instance, error) {
	if h.Driver != Name {
		return nil, errdefs.InvalidArgument("firecracker: handle is for driver %q", h.Driver)
	}
	var hd handleData
	if err := json.Unmarshal(h.Data, &hd); err != nil || hd.StateDir == "" || !idRE.MatchString(h.ID) {
		return nil, errdefs.InvalidArgument("firecracker: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	if hd.Root != "" {
		inst.root = hd.Root
	}
	inst.started = true
	_ = readJSON(inst.machinePath(), &inst.machine)
	pid := hd.Pid
	if pid <= 0 {
		pid = hostproc.ReadPid(inst.pidPath())
	}
	inst.pid = pid
	lost := func(why string) (driver.Instance, error) {
		_ = inst.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("firecracker: recover %s: %s: %w", h.ID, why, errdefs.ErrNotFound)
	}
	if pid <= 0 || !inst.ours(pid) {
		return lost("vm process is gone")
	}
	// Bounded, as the QEMU driver's: a VMM that accepts and never answers
	// held the server's start (Recover runs before it serves) for good.
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	info, err := inst.api().info(ictx)
	cancel()
	if err != nil {
		// The VMM is ours and alive: no answer (a cancelled start, a busy
		// host) says nothing about the VM, which is left running.
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("firecracker: recover %s: api: %v: %w", h.ID, err, errdefs.ErrUnavailable)
	}
	if info.State != stateRunning && info.State != statePaused {
		return lost(fmt.Sprintf("vm state %q", info.State))
	}
	return inst, nil
}

// DestroyHandle implements driver.HandleDestroyer: the VMM the handle (or
// its pid file) names is killed if it is this instance's, and its cgroups
// and directories are removed, without asking its API.
func (d *Driver) DestroyHandle(ctx context.Context, h driver.Handle) error {
	var hd handleData
	if h.Driver != Name || json.Unmarshal(h.Data, &hd) != nil || hd.StateDir == "" || !idRE.MatchString(h.ID) {
		return errdefs.InvalidArgument("firecracker: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	if hd.Root != "" {
		inst.root = hd.Root
	}
	inst.started = true
	inst.pid = hd.Pid
	return inst.Destroy(ctx)
}

func (d *Driver) newInstance(id, stateDir string) *Instance {
	return &Instance{d: d, id: id, stateDir: stateDir, root: d.rootDir(stateDir, id), log: d.log.With("sandbox", id)}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
