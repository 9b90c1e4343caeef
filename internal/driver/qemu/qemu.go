// Package qemu runs each sandbox as a QEMU microvm: its own guest kernel
// (Debian's cloud kernel, booted uncompressed through PVH), no NIC, the
// template's root filesystem as a shared read-only raw ext4 image behind a
// per-sandbox qcow2 overlay in the sandbox's state directory, and
// space-agent as PID 1 (the initramfs's /init, in --init mode).
//
// The agent speaks the usual protocol over a virtio-serial port whose host
// end is a unix socket QEMU listens on (<state>/agent.sock). QEMU serves
// one client at a time, so DialAgent closes the connection it handed out
// before and a session handshake (see agentconn.go) separates sessions on
// the port. Pause/resume are QMP stop/cont; checkpoint is a migration to a
// file, restore an incoming migration (checkpoint.go).
//
// QEMU runs in its own session, started inside the sandbox's cgroup, under
// a seccomp filter (-sandbox: no spawning, no obsolete or resource-control
// calls) and, once set up, as a uid and gid of its own (-runas, vmUID): a
// guest that escapes into QEMU holds no root, no capability, nothing of
// another VM's, and cannot change its cgroup limits. A server restart
// leaves VMs running, and Recover re-attaches by pid and QMP socket from
// the Handle. The accelerator is KVM only where a probe boot under KVM
// succeeds, TCG otherwise (accel.go).
package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/vmimage"
)

// Name is the driver's registry name.
const Name = "qemu"

// Config configures the QEMU driver.
type Config struct {
	QEMU    string // qemu-system-x86_64 (looked up on PATH when empty)
	QEMUImg string // qemu-img (looked up on PATH when empty)
	// CacheDir holds the extracted kernel and the initramfs builds
	// (internal/vmimage).
	CacheDir string
	// Accel forces "kvm" or "tcg"; empty probes (KVM only if a guest
	// really boots under it).
	Accel string
	// GroupCPUShares is the CPU weight of the parent cgroup of all
	// sandboxes (see gvisor.Config.GroupCPUShares; default 256, -1 leaves
	// it alone).
	GroupCPUShares int
	// NoCgroups runs VMs without cgroups of their own (no CPU quota,
	// memory or pid limit beyond QEMU's own -smp/-m). Without it a host
	// that has no cgroup filesystem cannot run QEMU sandboxes.
	NoCgroups bool
	Log       *slog.Logger
}

// Driver implements driver.Driver with QEMU microvms.
type Driver struct {
	cfg        Config
	log        *slog.Logger
	accel      string
	kernel     string // uncompressed vmlinux
	modulesDir string
	tscKHz     int
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

// New finds QEMU and the guest kernel and chooses the accelerator.
// Errors: errdefs.ErrUnavailable naming what is missing and how to get it.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	var err error
	if cfg.QEMU == "" {
		if cfg.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, errdefs.Unavailable("qemu: qemu-system-x86_64 not found: apt-get install -y qemu-system-x86")
		}
	}
	if cfg.QEMUImg == "" {
		if cfg.QEMUImg, err = exec.LookPath("qemu-img"); err != nil {
			return nil, errdefs.Unavailable("qemu: qemu-img not found: apt-get install -y qemu-utils")
		}
	}
	if cfg.CacheDir == "" {
		return nil, errdefs.InvalidArgument("qemu: no cache dir configured")
	}
	d := &Driver{cfg: cfg, log: cfg.Log.With("driver", Name)}
	if d.kernel, d.modulesDir, err = vmimage.Kernel(ctx, cfg.CacheDir); err != nil {
		return nil, err
	}
	d.tscKHz = hostTSCkHz()
	switch cfg.Accel {
	case AccelKVM, AccelTCG:
		d.accel = cfg.Accel
	case "":
		var why string
		d.accel, why = probeAccel(ctx, cfg.QEMU, d.kernel)
		d.log.Info("qemu accelerator", "accel", d.accel, "why", why)
	default:
		return nil, errdefs.InvalidArgument("qemu: unknown accelerator %q", cfg.Accel)
	}
	if !cfg.NoCgroups {
		if _, err := os.Stat(cgroup.Root); err != nil {
			return nil, errdefs.Unavailable("qemu: no cgroup filesystem at %s to put VMs in (run as root on a host with cgroups, or start the server with --qemu-cgroups off: VMs then have no cgroup limits)", cgroup.Root)
		}
		if cfg.GroupCPUShares == 0 {
			cfg.GroupCPUShares = cgroup.DefaultParentShares
		}
		if cfg.GroupCPUShares > 0 {
			if err := cgroup.SetParentShares(cfg.GroupCPUShares); err != nil {
				d.log.Warn("sandbox cgroup CPU weight not set", "err", err)
			}
		}
	}
	return d, nil
}

// limits are the cgroup limits of a VM: its vCPUs as a CPU quota, its
// guest memory plus QEMU's own (device models, and under TCG the
// translation cache, -accel tb-size) as a hard limit, a pid limit above
// QEMU's thread pools.
func (m machine) limits(low bool) cgroup.Limits {
	overhead := 256 + m.MemoryMB/4
	if m.Accel == AccelTCG {
		overhead += tcgTBSizeMB
	}
	return cgroup.Limits{CPUs: m.VCPU, MemoryMB: m.MemoryMB + overhead, Pids: 512, Low: low}
}

// accelArg is QEMU's -accel value: under TCG with the translation cache
// bounded (its memory is part of the VM's cgroup limit).
func accelArg(accel string) string {
	if accel == AccelTCG {
		return fmt.Sprintf("tcg,tb-size=%d", tcgTBSizeMB)
	}
	return accel
}

// tcgTBSizeMB bounds TCG's translation cache (QEMU's default is 1 GiB of
// virtual memory per VM on 64-bit hosts).
const tcgTBSizeMB = 256

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// minMemoryMB is the least memory a VM boots with (its kernel and agent).
const minMemoryMB = 128

// MinMemoryMB implements driver.MemoryFloor.
func (d *Driver) MinMemoryMB() int { return minMemoryMB }

// Accel is the accelerator in use ("kvm" or "tcg").
func (d *Driver) Accel() string { return d.accel }

// Capabilities implements driver.Driver.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Isolation:   "vm",
		Features:    []string{driver.CapPause, driver.CapCheckpoint, driver.CapRestore, driver.CapFork},
		Accelerator: d.accel,
	}
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)

// handleData is what Recover needs beyond the id.
type handleData struct {
	StateDir string `json:"state_dir"`
	Pid      int    `json:"pid,omitempty"`
}

// machine is everything that shapes the VM's hardware and boot. A restore
// must reproduce it exactly, so a checkpoint stores it (checkpoint.go).
type machine struct {
	Accel     string `json:"accel"`
	VCPU      int    `json:"vcpu"`
	MemoryMB  int    `json:"memory_mb"`
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
	Cmdline   string `json:"cmdline"`
}

func (d *Driver) normalize(spec *driver.Spec) error {
	if !idRE.MatchString(spec.ID) {
		return errdefs.InvalidArgument("qemu: invalid sandbox id %q", spec.ID)
	}
	if spec.StateDir == "" || !filepath.IsAbs(spec.StateDir) {
		return errdefs.InvalidArgument("qemu: state dir must be an absolute path")
	}
	if spec.RootfsKind != "raw" {
		return errdefs.InvalidArgument("qemu: rootfs must be a raw disk image, got kind %q", spec.RootfsKind)
	}
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.Mode().IsRegular() {
		return errdefs.InvalidArgument("qemu: rootfs image %s: %v", spec.Rootfs, err)
	}
	if _, err := os.Stat(spec.AgentPath); err != nil {
		return errdefs.Unavailable("qemu: agent binary: %v", err)
	}
	if spec.VCPU <= 0 {
		spec.VCPU = 1
	}
	if spec.MemoryMB <= 0 {
		spec.MemoryMB = 512
	}
	if spec.MemoryMB < minMemoryMB {
		return errdefs.InvalidArgument("qemu: %d MiB of memory is too little for a VM (minimum %d)", spec.MemoryMB, minMemoryMB)
	}
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
	if !idRE.MatchString(spec.Hostname) {
		return errdefs.InvalidArgument("qemu: invalid hostname %q", spec.Hostname)
	}
	return nil
}

// Create implements driver.Driver: the state dir, the sandbox's qcow2
// overlay over the template image, and the initramfs (cached). QEMU starts
// in Start.
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
		return nil, fmt.Errorf("qemu: state dir: %w", err)
	}
	initrd, err := vmimage.Initramfs(ctx, d.cfg.CacheDir, d.modulesDir, spec.AgentPath)
	if err != nil {
		return nil, err
	}
	if err := d.qemuImg(ctx, "create", "-q", "-f", "qcow2", "-b", spec.Rootfs, "-F", "raw", inst.diskPath()); err != nil {
		return nil, err
	}
	inst.machine = machine{
		Accel: d.accel, VCPU: spec.VCPU, MemoryMB: spec.MemoryMB,
		Kernel: d.kernel, Initramfs: initrd, Cmdline: d.cmdline(spec.Hostname),
	}
	if err := writeJSON(inst.machinePath(), inst.machine); err != nil {
		return nil, err
	}
	return inst, nil
}

// cmdline is the guest kernel's command line: trimmed for a fast boot, the
// console on the serial port (a log file on the host), the agent as init.
func (d *Driver) cmdline(hostname string) string {
	args := []string{
		"console=ttyS0", "quiet", "loglevel=4", "panic=-1", "reboot=t",
		"tsc=reliable", "no_timer_check", "mitigations=off", "cryptomgr.notests",
		"random.trust_cpu=on", "8250.nr_uarts=1", "i8042.noaux", "i8042.nomux", "i8042.nopnp",
		"rdinit=/init", "space.root=/dev/vda", "space.hostname=" + hostname,
	}
	if d.accel == AccelTCG && d.tscKHz > 0 {
		// microvm under TCG hangs calibrating the TSC without it.
		args = append(args, "tsc_early_khz="+strconv.Itoa(d.tscKHz))
	}
	return strings.Join(append(args, "--", "--init", "--serial", "/dev/virtio-ports/agent"), " ")
}

// qemuArgs is QEMU's command line for inst's machine (its overlay disk on
// fds 3 and 4); incoming restores from the migration stream on fd 5.
func (i *Instance) qemuArgs(incoming bool) []string {
	m := i.machine
	cpu := "max"
	if m.Accel == AccelKVM {
		cpu = "host"
	}
	args := []string{
		"-name", "space-" + i.id,
		"-M", "microvm,acpi=on",
		"-accel", accelArg(m.Accel),
		"-cpu", cpu,
		"-smp", strconv.Itoa(m.VCPU),
		"-m", strconv.Itoa(m.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", m.Kernel, "-initrd", m.Initramfs, "-append", m.Cmdline,
		"-chardev", "file,id=console,path=" + i.consolePath() + ",append=on", // append: capConsole cuts it
		"-serial", "chardev:console",
		// The overlay comes as descriptors the server opened (read-write
		// and read-only, fds 3 and 4): QEMU reopens its image when a
		// migration inactivates it, and as vmUID it could not open the
		// file itself. The template image behind it is world-readable.
		"-add-fd", "fd=3,set=1,opaque=rw", "-add-fd", "fd=4,set=1,opaque=ro",
		// Image locking is off for it: the two descriptors are two open
		// files whose locks conflict when QEMU switches between them
		// (the resume after a checkpoint failed to get the write lock);
		// the overlay is this VM's alone.
		"-drive", "id=root,if=none,format=qcow2,file=/dev/fdset/1,file.locking=off,discard=unmap",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + i.agentSock() + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=agent",
		"-qmp", "unix:" + i.qmpSock() + ",server=on,wait=off",
		"-pidfile", i.pidPath(),
		// No fork or exec (migrations go through descriptors the host
		// passes, checkpoint.go), no obsolete system calls, no scheduler
		// or affinity changes. elevateprivileges is left alone: denied,
		// it silently keeps -runas from dropping root (QEMU 7.2), and
		// once QEMU runs as vmUID there is nothing to elevate to.
		"-sandbox", "on,obsolete=deny,spawn=deny,resourcecontrol=deny",
		"-runas", fmt.Sprintf("%d:%d", vmUID(i.id), vmUID(i.id)),
	}
	if incoming {
		args = append(args, "-incoming", "fd:5") // launch's ExtraFiles[2]
	}
	return args
}

// Recover implements driver.Driver: the QEMU process named by the handle
// must still run (and be this sandbox's: its command line names the state
// dir) and answer on QMP.
func (d *Driver) Recover(ctx context.Context, h driver.Handle) (driver.Instance, error) {
	if h.Driver != Name {
		return nil, errdefs.InvalidArgument("qemu: handle is for driver %q", h.Driver)
	}
	var hd handleData
	if err := json.Unmarshal(h.Data, &hd); err != nil || hd.StateDir == "" {
		return nil, errdefs.InvalidArgument("qemu: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	inst.started = true
	_ = readJSON(inst.machinePath(), &inst.machine) // needed by Checkpoint only
	pid := hd.Pid
	if pid <= 0 {
		pid = hostproc.ReadPid(inst.pidPath())
	}
	inst.pid = pid
	lost := func(why string) (driver.Instance, error) {
		_ = inst.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("qemu: recover %s: %s: %w", h.ID, why, errdefs.ErrNotFound)
	}
	if pid <= 0 || !inst.ours(pid) {
		return lost("vm process is gone")
	}
	// The process is ours and alive: a monitor that does not answer (a
	// cancelled start, a host too busy for 10 s) says nothing about the
	// VM, so it is left running (destroying it here killed every VM a
	// server stopped during its start-up recovery); only a VM that says
	// it is dead is.
	unsure := func(err error) (driver.Instance, error) {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("qemu: recover %s: monitor: %v: %w", h.ID, err, errdefs.ErrUnavailable)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := dialQMP(qctx, inst.qmpSock())
	if err != nil {
		return unsure(err)
	}
	st, err := q.status(qctx)
	q.Close()
	if err != nil {
		return unsure(err)
	}
	if st == "shutdown" || st == "internal-error" || st == "guest-panicked" {
		return lost(fmt.Sprintf("vm status %q", st))
	}
	go inst.capConsole()
	return inst, nil
}

// DestroyHandle implements driver.HandleDestroyer: the VM process the
// handle (or its pid file) names is killed if it is this instance's, and
// its cgroups and state dir are removed, without asking its monitor.
func (d *Driver) DestroyHandle(ctx context.Context, h driver.Handle) error {
	var hd handleData
	if h.Driver != Name || json.Unmarshal(h.Data, &hd) != nil || hd.StateDir == "" || !idRE.MatchString(h.ID) {
		return errdefs.InvalidArgument("qemu: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	inst.started = true
	inst.pid = hd.Pid
	return inst.Destroy(ctx)
}

func (d *Driver) newInstance(id, stateDir string) *Instance {
	return &Instance{d: d, id: id, stateDir: stateDir, log: d.log.With("sandbox", id)}
}

func (d *Driver) qemuImg(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, d.cfg.QEMUImg, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %v: %s", args[0], err, bytes.TrimSpace(out))
	}
	return nil
}

// Instance is one VM (one sandbox).
type Instance struct {
	d        *Driver
	id       string
	stateDir string
	log      *slog.Logger
	machine  machine

	dialMu sync.Mutex // one DialAgent at a time: the port has one host end

	low bool // pooled: the lowest CPU share until Prioritize

	mu        sync.Mutex
	current   net.Conn // the agent connection last handed out
	started   bool
	pid       int
	destroyed bool
}

func (i *Instance) diskPath() string    { return filepath.Join(i.stateDir, "disk.qcow2") }
func (i *Instance) agentSock() string   { return filepath.Join(i.stateDir, "agent.sock") }
func (i *Instance) qmpSock() string     { return filepath.Join(i.stateDir, "qmp.sock") }
func (i *Instance) pidPath() string     { return filepath.Join(i.stateDir, "qemu.pid") }
func (i *Instance) consolePath() string { return filepath.Join(i.stateDir, "console.log") }
func (i *Instance) logPath() string     { return filepath.Join(i.stateDir, "qemu-start.log") }
func (i *Instance) machinePath() string { return filepath.Join(i.stateDir, "machine.json") }

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// Handle implements driver.Instance.
func (i *Instance) Handle() driver.Handle {
	i.mu.Lock()
	pid := i.pid
	i.mu.Unlock()
	data, _ := json.Marshal(handleData{StateDir: i.stateDir, Pid: pid})
	return driver.Handle{Driver: Name, ID: i.id, Data: data}
}

// Start implements driver.Instance: it launches QEMU (in its
// own session) and returns once the VM runs; the agent answers DialAgent
// when the guest has booted.
func (i *Instance) Start(ctx context.Context) error {
	i.mu.Lock()
	if i.started {
		i.mu.Unlock()
		return errdefs.Conflict("sandbox already started")
	}
	i.started = true
	i.mu.Unlock()
	return i.launch(ctx, nil)
}

// launch starts QEMU in its own session (not tied to ctx: the VM outlives
// the call and the server) and returns once its monitor answers, or with
// QEMU's output when it exits first. incoming, when set, is an open
// migration stream to restore from. The caller destroys the VM on an
// error.
//
// It is not daemonized: QEMU's -daemonize forks after its seccomp filter
// is in place, which spawn=deny forbids. Its output goes to a file.
func (i *Instance) launch(ctx context.Context, incoming *os.File) error {
	logPath := i.logPath()
	// Appended to and capped with the console (capConsole): QEMU writes
	// its errors there for the VM's whole life, and a guest that makes it
	// complain without end would fill the disk.
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: start %s: %w", i.id, err)
	}
	defer out.Close()
	cmd := exec.Command(i.d.cfg.QEMU, i.qemuArgs(incoming != nil)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	rw, err := os.OpenFile(i.diskPath(), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("qemu: start %s: %w", i.id, err)
	}
	defer rw.Close()
	ro, err := os.Open(i.diskPath())
	if err != nil {
		return fmt.Errorf("qemu: start %s: %w", i.id, err)
	}
	defer ro.Close()
	cmd.ExtraFiles = []*os.File{rw, ro}
	if incoming != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, incoming)
	}
	// QEMU starts inside the sandbox's cgroup: placed after it started,
	// the booted (or restored) VM's memory stayed charged to the server's
	// cgroup.
	if i.d.cfg.NoCgroups {
		err = cmd.Start()
	} else {
		err = cgroup.Start(i.id, cmd, i.machine.limits(i.low))
	}
	if err != nil {
		return fmt.Errorf("qemu: start %s: %v", i.id, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reaps it while this server runs
	i.mu.Lock()
	i.pid = cmd.Process.Pid
	i.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
	for {
		qctx, qcancel := context.WithTimeout(wctx, time.Second)
		q, err := dialQMP(qctx, i.qmpSock())
		qcancel()
		if err == nil {
			q.Close()
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("qemu: start %s: %s: %s", i.id, cmd.ProcessState, hostproc.TailFile(logPath, 1500))
		case <-wctx.Done():
			return fmt.Errorf("qemu: start %s: no monitor after %v: %v: %s", i.id, launchTimeout, wctx.Err(), hostproc.TailFile(logPath, 1500))
		case <-time.After(5 * time.Millisecond):
		}
	}
	go i.capConsole()
	return nil
}

// launchTimeout bounds the wait for a new QEMU's monitor.
const launchTimeout = 30 * time.Second

// vmUID is the uid and gid a VM's QEMU runs as once set up: one of its
// own, from a range no host account uses (2^24 ids from 2,000,000,000,
// chosen by the sandbox id), so a QEMU a guest took over can signal or
// trace no other VM, and owns no file (everything it uses it opened as
// root before dropping to it). Two VMs share one with a probability of
// about n²/2^25 among n VMs.
func vmUID(id string) int {
	h := fnv.New64a()
	h.Write([]byte(id))
	return vmUIDBase + int(h.Sum64()%(1<<24))
}

const vmUIDBase = 2_000_000_000

// Console log bounds (hostproc.CapFile): its tail is all that is read.
const (
	consoleMax  = 8 << 20
	consoleKeep = 256 << 10
)

// capConsole keeps the VM's console log and QEMU's own log within
// consoleMax while it runs.
func (i *Instance) capConsole() {
	alive := func() bool {
		i.mu.Lock()
		pid, destroyed := i.pid, i.destroyed
		i.mu.Unlock()
		return !destroyed && hostproc.Alive(pid)
	}
	go hostproc.CapFile(i.logPath(), consoleMax, consoleKeep, 5*time.Second, alive)
	hostproc.CapFile(i.consolePath(), consoleMax, consoleKeep, 5*time.Second, alive)
}

// Prioritize implements driver.Prioritizer: a pooled VM's cgroup gets the
// normal CPU share.
func (i *Instance) Prioritize(ctx context.Context) error {
	if i.d.cfg.NoCgroups {
		return nil
	}
	return cgroup.Prioritize(i.id)
}

// Pause implements driver.Instance (QMP stop: the vCPUs halt).
func (i *Instance) Pause(ctx context.Context) error {
	return qmpDo(ctx, i.qmpSock(), "stop", nil, nil)
}

// Resume implements driver.Instance (QMP cont).
func (i *Instance) Resume(ctx context.Context) error {
	return qmpDo(ctx, i.qmpSock(), "cont", nil, nil)
}

// DialAgent implements driver.Instance. It closes the connection handed
// out before (QEMU serves one client; the newest caller wins), connects to
// the port's socket and runs the session handshake, retrying until the
// agent answers or ctx ends.
func (i *Instance) DialAgent(ctx context.Context) (net.Conn, error) {
	i.dialMu.Lock()
	defer i.dialMu.Unlock()
	i.mu.Lock()
	old := i.current
	i.current = nil
	i.mu.Unlock()
	if old != nil {
		old.Close()
	}
	wait := 2 * time.Millisecond
	var lastErr error
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", i.agentSock())
		if err == nil {
			var conn net.Conn
			conn, err = handshake(ctx, c)
			if err == nil {
				i.mu.Lock()
				i.current = conn
				i.mu.Unlock()
				return conn, nil
			}
			c.Close()
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		if i.exited() {
			return nil, fmt.Errorf("qemu: vm %s is not running (console: %s): %w", i.id, hostproc.TailFile(i.consolePath(), 1500), errdefs.ErrUnavailable)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait = min(wait*2, 100*time.Millisecond)
	}
	return nil, fmt.Errorf("qemu: waiting for agent of %s: %v: %w", i.id, lastErr, errdefs.ErrUnavailable)
}

// exited reports whether the VM was started and its process is gone.
func (i *Instance) exited() bool {
	i.mu.Lock()
	pid, started := i.pid, i.started
	i.mu.Unlock()
	return started && pid > 0 && !hostproc.Alive(pid)
}

// Wait implements driver.Instance, on a pidfd of the QEMU process (which
// is not the server's child), so it works for recovered instances too.
func (i *Instance) Wait(ctx context.Context) (driver.ExitStatus, error) {
	return hostproc.WaitInstance(ctx, func() (int, bool) {
		i.mu.Lock()
		defer i.mu.Unlock()
		return i.pid, i.destroyed
	})
}

// Detach implements driver.Detacher: it closes the agent connection; the
// VM runs on and a later Recover re-attaches.
func (i *Instance) Detach() {
	i.mu.Lock()
	c := i.current
	i.current = nil
	i.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Destroy implements driver.Instance: it kills QEMU (if it is still this
// sandbox's process) and removes the state dir.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	i.destroyed = true
	pid := i.pid
	i.mu.Unlock()
	i.Detach()
	if pid <= 0 {
		pid = hostproc.ReadPid(i.pidPath()) // a launch that failed half-way
	}
	if pid > 0 && i.ours(pid) {
		_ = unix.Kill(pid, unix.SIGKILL)
		deadline := time.Now().Add(10 * time.Second)
		for hostproc.Alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("qemu: vm %s (pid %d) did not die", i.id, pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !i.d.cfg.NoCgroups {
		if err := cgroup.Remove(i.id); err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
	}
	if i.stateDir != "" {
		if err := os.RemoveAll(i.stateDir); err != nil {
			return fmt.Errorf("qemu: remove state dir: %w", err)
		}
	}
	return nil
}

// ours reports whether pid is a live QEMU of this instance: its command
// line names this instance's QMP socket (guards against pid reuse).
func (i *Instance) ours(pid int) bool {
	if !hostproc.Alive(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte(i.qmpSock()))
}

// hostTSCkHz reads the host's TSC frequency (the "cpu MHz" of a host with
// a constant TSC), for tsc_early_khz under TCG. 0 when unknown.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(f * 1000)
			}
		}
	}
	return 0
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
