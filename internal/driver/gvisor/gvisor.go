// Package gvisor runs sandboxes under gVisor's runsc: a user-space kernel per
// sandbox, no network (--network=none), the template rootfs shared read-only
// with a per-sandbox overlay upper layer in the sandbox's state directory,
// and cgroup limits for CPU, memory and pids.
//
// The guest agent is the container's init. It dials a unix socket in a
// directory bind-mounted from the sandbox's state directory (--host-uds=open);
// the driver listens on that socket. gVisor disconnects host sockets on
// checkpoint, so the agent redials whenever its connection breaks, and a
// restarted server simply listens again at the same path.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
	gvisorpatches "github.com/spacesandbox/space/third_party/gvisor"
)

// Name is the driver's registry name.
const Name = "gvisor"

// Config configures the gVisor driver.
type Config struct {
	Runsc string // path to the runsc binary
	Root  string // runsc --root: where runsc keeps container state
	// Platform is runsc's --platform (default systrap; never kvm on PVM hosts).
	Platform string
	// GroupCPUShares is the CPU weight of the cgroup all sandboxes live
	// under (space/, cgroup v1 cpu.shares; scaled for v2 cpu.weight),
	// against one host process at nice 0 (1024). Default 256: the control
	// plane is served first when it needs the CPU (a burst of claims
	// wakes many sandboxes at once, and gVisor sandboxes waking up kept
	// this 2-core host's server from answering creates for ~100 ms);
	// sandboxes still get every cycle nobody else wants. -1 leaves the
	// weight alone.
	GroupCPUShares int
	// AgentStore holds the agent binaries sandboxes run, by SHA-256
	// (agent.go). Default: "agents" next to Root.
	AgentStore string
	Log        *slog.Logger
}

// Driver implements driver.Driver with runsc.
type Driver struct {
	cfg      Config
	log      *slog.Logger
	runscSum runscDigest // of cfg.Runsc, for checkpoint image stamps
	agents   agentStore
	// tarStreams is set when runsc streams files into its tar of the
	// writable layer (the build lists "tar-stream" in a features file next
	// to it: third_party/gvisor): no file is then held whole in memory.
	tarStreams bool
}

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.Instance        = (*Instance)(nil)
	_ driver.Detacher        = (*Instance)(nil)
	_ driver.Checkpointer    = (*Instance)(nil)
	_ driver.UpperExporter   = (*Instance)(nil)
	_ driver.Restorer        = (*Driver)(nil)
	_ driver.HandleDestroyer = (*Driver)(nil)
)

// New checks that runsc runs and returns the driver.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Runsc == "" {
		return nil, errdefs.Unavailable("gvisor: no runsc binary configured")
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: runsc root: %w", err)
	}
	out, err := exec.CommandContext(ctx, cfg.Runsc, "--version").CombinedOutput()
	if err != nil {
		return nil, errdefs.Unavailable("gvisor: %s --version: %v: %s", cfg.Runsc, err, bytes.TrimSpace(out))
	}
	if cfg.AgentStore == "" {
		cfg.AgentStore = filepath.Join(filepath.Dir(cfg.Root), "agents")
	}
	d := &Driver{cfg: cfg, log: cfg.Log.With("driver", Name), agents: agentStore{dir: cfg.AgentStore},
		tarStreams: runscFeatures(cfg.Runsc)["tar-stream"]}
	if !d.tarStreams {
		d.log.Warn("this runsc copies each file whole into the sandbox's memory to snapshot it: files larger than the sandbox's room are refused (413); build it with `make runsc` to lift that", "runsc", cfg.Runsc)
	}
	d.agents.gc()
	go d.runscSHA256() // for checkpoint stamps; ready before the first one
	if cfg.GroupCPUShares == 0 {
		cfg.GroupCPUShares = cgroup.DefaultParentShares
	}
	if cfg.GroupCPUShares > 0 {
		if err := cgroup.SetParentShares(cfg.GroupCPUShares); err != nil {
			d.log.Warn("sandbox cgroup CPU weight not set", "err", err)
		}
	}
	return d, nil
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return Name }

// Capabilities implements driver.Driver.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Isolation: "gvisor", Features: []string{driver.CapPause, driver.CapCheckpoint, driver.CapRestore, driver.CapFork, driver.CapFilesSnapshot}}
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)

// handleData is what Recover needs beyond the id.
type handleData struct {
	StateDir string `json:"state_dir"`
}

// Create implements driver.Driver: it writes the OCI bundle, opens the agent
// socket. Nothing runs until Start (`runsc run --detach`).
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
	return asInstance(d.launch(ctx, spec, "", imageStamp{}))
}

// asInstance returns launch's result as the interface: a nil interface,
// not a nil *Instance in it, on error (callers test inst != nil to clean up).
func asInstance(inst *Instance, err error) (driver.Instance, error) {
	if err != nil {
		return nil, err
	}
	return inst, nil
}

// Restore implements driver.Restorer: a new instance (its own id, state
// dir and agent socket) from a checkpoint image, running when it returns.
// The agent inside redials and lands on the new instance's socket.
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, checkpointDir string) (driver.Instance, error) {
	if _, err := os.Stat(filepath.Join(checkpointDir, "checkpoint.img")); err != nil {
		return nil, errdefs.InvalidArgument("gvisor: %s is not a checkpoint image: %v", checkpointDir, err)
	}
	st, err := readImageStamp(checkpointDir)
	if err != nil {
		return nil, err
	}
	if err := d.checkImageStamp(st); err != nil {
		return nil, err
	}
	return asInstance(d.launch(ctx, spec, checkpointDir, st))
}

// launch prepares an instance (bundle, state dirs, agent socket); given a
// checkpoint image (and its stamp, read by Restore) it also runs
// `runsc restore --detach`.
func (d *Driver) launch(ctx context.Context, spec driver.Spec, image string, st imageStamp) (_ *Instance, err error) {
	if err := d.normalize(&spec); err != nil {
		return nil, err
	}
	inst := d.newInstance(spec.ID, spec.StateDir)
	defer func() {
		if err != nil {
			_ = inst.Destroy(context.WithoutCancel(ctx))
		}
	}()
	for _, dir := range []string{inst.bundleDir(), inst.runDir(), inst.upperDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: state dir: %w", err)
		}
	}
	// The sandbox's user-space kernel connects to the socket as root on
	// the host side through the gofer; nobody else may.
	if err := os.Chmod(inst.runDir(), 0o700); err != nil {
		return nil, err
	}
	if image == "" {
		err = inst.newSecret()
	} else {
		err = inst.adoptSecret(image)
	}
	if err != nil {
		return nil, err
	}
	if err := inst.listen(); err != nil {
		return nil, err
	}
	// The sandbox's own agent binary: the server's, or the one a
	// checkpoint image carries (the process restored from it runs that).
	agentSrc, agentSum := spec.AgentPath, ""
	if st.AgentSHA256 != "" {
		agentSrc, agentSum = filepath.Join(image, imageAgentFile), st.AgentSHA256
	}
	if err := d.pinAgent(inst, agentSrc, agentSum); err != nil {
		return nil, err
	}
	spec.AgentPath = inst.agentPath()
	// A restore's spec must name the agent's arguments as the
	// checkpointed one did: --auth-file since version 9, which is when
	// images carry the secret.
	inst.mu.Lock()
	auth := inst.secret != nil
	inst.mu.Unlock()
	cfg := buildSpec(spec, inst.runDir(), auth)
	if image != "" {
		recorded, err := checkpointSpec(image)
		if err != nil {
			return nil, err
		}
		cfg.Mounts = conformMounts(cfg.Mounts, recorded.Mounts)
		// A checkpoint taken with noNewPrivileges (before setuid was
		// allowed) restores with it: runsc compares the process spec.
		cfg.Process.NoNewPrivileges = recorded.Process.NoNewPrivileges
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(inst.bundleDir(), "config.json"), cfgJSON, 0o600); err != nil {
		return nil, err
	}
	inst.flags = d.createFlags(spec)
	inst.low = spec.LowPriority
	inst.memory = int64(spec.MemoryMB) << 20
	if image == "" {
		// Nothing runs until Start: `runsc run --detach` there. (Not
		// create+start: a sandbox made by `runsc create` with
		// --network=none comes up without a loopback interface, and the
		// egress endpoint lives on loopback.)
		return inst, nil
	}
	if err := inst.runsc(ctx, "restore", "--detach", "--image-path", image, "--bundle", inst.bundleDir(), "--pid-file", inst.pidPath(), spec.ID); err != nil {
		return nil, err
	}
	inst.created = true
	inst.started = true
	if b, err := os.ReadFile(inst.pidPath()); err == nil {
		fmt.Sscan(string(b), &inst.pid)
	}
	inst.raiseMemoryLimit()
	// The restored agent still holds the socket the checkpointed sandbox
	// had, dropped by the restore: make it dial this instance now.
	inst.reconnectAgent(nil)
	return inst, nil
}

func (d *Driver) normalize(spec *driver.Spec) error {
	if !idRE.MatchString(spec.ID) {
		return errdefs.InvalidArgument("gvisor: invalid sandbox id %q", spec.ID)
	}
	if spec.RootfsKind != "" && spec.RootfsKind != "dir" {
		return errdefs.InvalidArgument("gvisor: rootfs must be a directory, got %q", spec.RootfsKind)
	}
	if fi, err := os.Stat(filepath.Join(spec.Rootfs, "bin")); err != nil || !fi.IsDir() {
		return errdefs.InvalidArgument("gvisor: rootfs %s is not a root filesystem", spec.Rootfs)
	}
	if _, err := os.Stat(spec.AgentPath); err != nil {
		return errdefs.Unavailable("gvisor: agent binary: %v", err)
	}
	if spec.VCPU <= 0 {
		spec.VCPU = 1
	}
	if spec.MemoryMB <= 0 {
		spec.MemoryMB = 512
	}
	if spec.PidsMax <= 0 {
		spec.PidsMax = 1024
	}
	if spec.DiskMB <= 0 {
		spec.DiskMB = 10240
	}
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
	return nil
}

// Checkpoint implements driver.Checkpointer: the full state (memory,
// processes, the overlay upper layer) into dir. Without leaveRunning the
// sandbox stops afterwards. A paused sandbox is checkpointed as it is
// frozen and stays paused (the sentry's own pause for the save nests in
// runsc pause's): the image is exactly the state Resume thaws.
func (i *Instance) Checkpoint(ctx context.Context, dir string, leaveRunning bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	args := []string{"checkpoint", "--image-path", dir}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	// Connections made before the checkpoint do not survive it (the
	// sentry is stopped while it saves, so none can be made meanwhile).
	stale := i.liveConns()
	_, err := i.d.runsc(ctx, i, nil, append(args, i.id)...)
	if leaveRunning {
		i.mu.Lock()
		paused := i.paused
		if paused {
			i.reconnectOnResume = true
		}
		i.mu.Unlock()
		if paused {
			closeAll(stale) // the signal waits for Resume
		} else {
			i.reconnectAgent(stale)
		}
	}
	if err != nil {
		return err
	}
	return i.stampImage(dir)
}

// exportPipeSize is the FIFO capacity and read size of ExportUpper.
const exportPipeSize = 1 << 20

// ExportUpper implements driver.UpperExporter: the sandbox's writable layer
// (changes against the template, deletions as whiteouts) as a tar stream,
// without stopping the sandbox.
func (i *Instance) ExportUpper(ctx context.Context, w io.Writer) error {
	// runsc prints a banner on stdout, so the archive goes through a FIFO
	// in the sandbox's state dir: streamed, never staged on disk.
	fifo := filepath.Join(i.stateDir, fmt.Sprintf("upper-%d.tar", time.Now().UnixNano()))
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return fmt.Errorf("export upper: %w", err)
	}
	defer os.Remove(fifo)
	cmd := exec.CommandContext(ctx, i.d.cfg.Runsc, "--root", i.d.cfg.Root, "tar", "rootfs-upper", "--file", fifo, i.id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	copied := make(chan error, 1)
	go func() {
		// Blocks until runsc opens the write end; EOF when it closes it.
		f, err := os.OpenFile(fifo, os.O_RDONLY, 0)
		if err != nil {
			copied <- err
			return
		}
		defer f.Close()
		// The layer can be gigabytes: a 1 MiB pipe and reads to match
		// cut the system calls on both ends by 16 (a failure to grow
		// it only costs speed).
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, exportPipeSize) })
		}
		// (*os.File).WriteTo would copy 32 KiB at a time: hide it.
		_, err = io.CopyBuffer(w, struct{ io.Reader }{f}, make([]byte, exportPipeSize))
		copied <- err
	}()
	werr := cmd.Wait()
	if werr != nil {
		// Unblock the reader if runsc never opened the FIFO.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-copied
		return fmt.Errorf("runsc tar rootfs-upper: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return <-copied
}

// createFlags are the global flags that shape a sandbox; they must be the
// same for create and (later) restore.
func (d *Driver) createFlags(spec driver.Spec) []string {
	return []string{
		"--network=none",
		// Each gofer gets its own empty network namespace: no shared
		// nsfs mount left under the runsc root.
		"--gofer-network-namespace=new",
		"--platform=" + d.cfg.Platform,
		"--host-uds=open",
		// setuid programs (sudo) raise privileges inside the sandbox,
		// as on Linux; see NoNewPrivileges in buildSpec.
		"--allow-suid",
		fmt.Sprintf("--overlay2=root:dir=%s,size=%dm", filepath.Join(spec.StateDir, "upper"), spec.DiskMB),
	}
}

// Recover implements driver.Driver.
func (d *Driver) Recover(ctx context.Context, h driver.Handle) (driver.Instance, error) {
	if h.Driver != Name {
		return nil, errdefs.InvalidArgument("gvisor: handle is for driver %q", h.Driver)
	}
	var hd handleData
	if err := json.Unmarshal(h.Data, &hd); err != nil || hd.StateDir == "" {
		return nil, errdefs.InvalidArgument("gvisor: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	inst.created = true
	sctx, cancel := context.WithTimeout(ctx, runscAnswerWithin)
	st, err := inst.state(sctx)
	cancel()
	if err != nil && !strings.Contains(err.Error(), "does not exist") {
		// Not an answer: a cancelled start, a runsc that timed out on a
		// busy host. The sandbox may well run; destroying it here killed
		// every sandbox a server stopped during its start-up recovery.
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("gvisor: recover %s: %v: %w", h.ID, err, errdefs.ErrUnavailable)
	}
	if err == nil && st.Pid > 0 && !hostproc.Alive(st.Pid) {
		st.Status = "stopped" // runsc's state file outlived the sandbox process
	}
	if err != nil || (st.Status != "running" && st.Status != "paused" && st.Status != "created") {
		_ = inst.Destroy(context.WithoutCancel(ctx))
		if err == nil {
			err = fmt.Errorf("container is %s", st.Status)
		}
		return nil, fmt.Errorf("gvisor: recover %s: %v: %w", h.ID, err, errdefs.ErrNotFound)
	}
	inst.started = st.Status != "created"
	inst.paused = st.Status == "paused"
	inst.pid = st.Pid
	if err := inst.loadSecret(); err != nil {
		return nil, fmt.Errorf("gvisor: recover %s: %v: %w", h.ID, err, errdefs.ErrUnavailable)
	}
	if err := inst.listen(); err != nil {
		// It runs; only its socket could not be made (no descriptors
		// left, a full disk): no verdict on the sandbox.
		return nil, fmt.Errorf("gvisor: recover %s: %v: %w", h.ID, err, errdefs.ErrUnavailable)
	}
	return inst, nil
}

// DestroyHandle implements driver.HandleDestroyer.
func (d *Driver) DestroyHandle(ctx context.Context, h driver.Handle) error {
	var hd handleData
	if h.Driver != Name || json.Unmarshal(h.Data, &hd) != nil || hd.StateDir == "" || !idRE.MatchString(h.ID) {
		return errdefs.InvalidArgument("gvisor: bad handle for %s", h.ID)
	}
	inst := d.newInstance(h.ID, hd.StateDir)
	inst.created = true
	return inst.Destroy(ctx)
}

// runscAnswerWithin bounds a runsc state or delete that recovery and
// destroys wait for.
const runscAnswerWithin = 30 * time.Second

func (d *Driver) newInstance(id, stateDir string) *Instance {
	return &Instance{d: d, id: id, stateDir: stateDir, log: d.log.With("sandbox", id), conns: make(chan net.Conn, 1), gone: make(chan struct{})}
}

// runsc runs one runsc command with the driver's global flags plus extra.
func (d *Driver) runsc(ctx context.Context, inst *Instance, extra []string, args ...string) ([]byte, error) {
	full := append([]string{"--root", d.cfg.Root}, extra...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, d.cfg.Runsc, full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return out, fmt.Errorf("runsc %s: %v: %s", args[0], err, msg)
	}
	return out, nil
}

// Instance is one runsc container (one sandbox).
type Instance struct {
	d        *Driver
	id       string
	stateDir string
	log      *slog.Logger

	mu        sync.Mutex
	ln        net.Listener
	conns     chan net.Conn
	live      map[net.Conn]struct{} // accepted and not closed by us
	flags     []string              // runsc global flags of this sandbox (same for run and restore)
	created   bool
	started   bool
	low       bool   // booted for the warm pool (driver.Spec.LowPriority)
	memory    int64  // the sandbox's memory in bytes (0: read from the bundle)
	agentSum  string // SHA-256 of the pinned agent (agent.go); "" until known
	secret    []byte // the agent's secret (auth.go); nil: not authenticated
	authOnce  sync.Once
	refused   atomic.Int64 // connections that did not authenticate
	pid       int
	destroyed bool
	gone      chan struct{} // closed by Destroy: ends DialAgent waits
	// paused is set between Pause and Resume (and by Recover for a
	// sandbox found paused); reconnectOnResume is set by a checkpoint
	// of the paused sandbox, whose agent is told to reconnect only once
	// it runs again (a frozen agent cannot act on the signal).
	paused            bool
	reconnectOnResume bool
}

func (i *Instance) bundleDir() string { return filepath.Join(i.stateDir, "bundle") }
func (i *Instance) runDir() string    { return filepath.Join(i.stateDir, "run") }
func (i *Instance) upperDir() string  { return filepath.Join(i.stateDir, "upper") }
func (i *Instance) sockPath() string  { return filepath.Join(i.runDir(), "agent.sock") }
func (i *Instance) logPath() string   { return filepath.Join(i.stateDir, "console.log") }
func (i *Instance) pidPath() string   { return filepath.Join(i.stateDir, "pid") }

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// Handle implements driver.Instance.
func (i *Instance) Handle() driver.Handle {
	data, _ := json.Marshal(handleData{StateDir: i.stateDir})
	return driver.Handle{Driver: Name, ID: i.id, Data: data}
}

// Start implements driver.Instance.
func (i *Instance) Start(ctx context.Context) error {
	i.mu.Lock()
	if i.started {
		i.mu.Unlock()
		return errdefs.Conflict("sandbox already started")
	}
	i.started = true
	i.mu.Unlock()
	if err := i.runsc(ctx, "run", "--detach", "--bundle", i.bundleDir(), "--pid-file", i.pidPath(), i.id); err != nil {
		return err
	}
	i.mu.Lock()
	i.created = true
	i.mu.Unlock()
	if b, err := os.ReadFile(i.pidPath()); err == nil {
		fmt.Sscan(string(b), &i.pid)
	}
	i.raiseMemoryLimit()
	return nil
}

// memoryHeadroom is how far above the sandbox's memory the host's hard
// limit sits: room for the sentry's own memory and for the time between
// the sandbox reaching its memory and the agent killing its largest
// process (WatchMemory). On a quiet host 30 allocations of 400 MiB to
// 1 GiB in a 256 MiB sandbox, started back to back, peaked at most 15 MiB
// above the sandbox's memory before they were killed; with three busy
// loops beside the server on this 2-core host the watch came late enough
// that the host's OOM killer stopped the sandbox in 5 of 16 runs of that
// test with a 64 MiB floor, 1 of 10 with 128 MiB, 0 of 22 with 256 MiB.
// The reaction time does not grow with the sandbox, so the floor is a
// constant.
func memoryHeadroom(memory int64) int64 { return max(256<<20, memory/4) }

// raiseMemoryLimit lifts the host's hard limit of a booted sandbox to its
// memory plus memoryHeadroom. runsc set the limit from the spec and booted
// the sentry with that as the sandbox's total memory (what /proc/meminfo
// and the agent's budgets see); the headroom above it is for the host
// only. Without it, the host's OOM killer would stop the whole sandbox
// when a process allocates quickly past its memory. Best effort: logged.
func (i *Instance) raiseMemoryLimit() {
	mem := i.nominalMemory()
	if mem <= 0 {
		return
	}
	if err := cgroup.SetMemoryLimit(i.id, mem+memoryHeadroom(mem)); err != nil {
		i.log.Warn("memory headroom not set: a process past the sandbox's memory stops the sandbox", "err", err)
	}
}

// exportMargin is what ExportFileLimit keeps back for the sentry's own
// memory. Measured (512 MiB sandbox, 7 MiB used): a 550 MiB file exported,
// a 700 MiB file stopped the sandbox.
const exportMargin = 96 << 20

// ExportFileLimit implements driver.ExportLimiter: a stock runsc tars the
// writable layer by copying each file whole into the sentry's memory, which
// counts against the host limit (the sandbox's memory plus its headroom).
// The build `make runsc` makes streams files: no limit.
func (i *Instance) ExportFileLimit(memUsed int64) int64 {
	return i.d.exportFileLimit(i.nominalMemory(), memUsed)
}

// exportFileLimit is ExportFileLimit for a sandbox of mem bytes.
func (d *Driver) exportFileLimit(mem, memUsed int64) int64 {
	if d.tarStreams || mem <= 0 { // streamed, or unknown: nothing to check against
		return math.MaxInt64
	}
	return max(mem+memoryHeadroom(mem)-memUsed-exportMargin, 0)
}

// nominalMemory is the sandbox's memory in bytes, from the spec it was
// launched with (or, for a recovered instance, from its bundle).
func (i *Instance) nominalMemory() int64 {
	if i.memory > 0 {
		return i.memory
	}
	var spec ociSpec
	b, err := os.ReadFile(filepath.Join(i.bundleDir(), "config.json"))
	if err != nil || json.Unmarshal(b, &spec) != nil || spec.Linux.Resources.Memory == nil {
		return 0
	}
	return spec.Linux.Resources.Memory.Limit
}

// WatchMemory implements driver.MemoryWatcher on the sandbox's memory
// cgroup (cgroup v1 thresholds: nothing polls).
func (i *Instance) WatchMemory(ctx context.Context, fn func() int64) error {
	mem := i.nominalMemory()
	if mem <= 0 {
		return fmt.Errorf("gvisor: %s: sandbox memory unknown", i.id)
	}
	return cgroup.WatchMemory(ctx, i.id, mem, func(int64) int64 { return fn() })
}

// runsc starts a sandbox with `runsc <flags> verb args…`. The sandbox
// inherits runsc's stdio for its whole life, so it gets a log file
// (append-only: gVisor writes at offset 0 otherwise), never a pipe the
// server would have to drain.
func (i *Instance) runsc(ctx context.Context, verb string, args ...string) error {
	logf, err := os.OpenFile(i.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	full := append(append([]string{"--root", i.d.cfg.Root}, i.flags...), verb)
	cmd := exec.CommandContext(ctx, i.d.cfg.Runsc, append(full, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// When the context ends first (a start or restore that hangs: once in
	// CI a start hung 2 minutes with nothing in the log), runsc is asked
	// for its goroutines before it is killed: Go prints them on SIGQUIT,
	// into the log, and the error carries where it waited.
	cmd.Cancel = func() error { return cmd.Process.Signal(unix.SIGQUIT) }
	cmd.WaitDelay = quitGrace
	err = cmd.Start()
	if err == nil && i.low {
		// A pooled sandbox's boot work done outside its cgroup (runsc
		// itself, until it moves the sandbox and gofer in) runs at the
		// lowest priority too: at nice 0 in the host's cgroup it would
		// outweigh every sandbox in use. Children forked from now on
		// inherit it; inside the sandbox's own cgroup it changes nothing.
		_ = unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, 19)
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		// A half-made container must not linger.
		i.mu.Lock()
		i.created = true
		i.mu.Unlock()
		detail := hostproc.TailFile(i.logPath(), 2000)
		if ctx.Err() != nil {
			detail = goroutineDump(i.logPath(), 4000)
		}
		return fmt.Errorf("runsc %s: %v: %s", verb, err, detail)
	}
	return nil
}

// quitGrace is how long runsc has to print its goroutines after SIGQUIT
// before it is killed. A var for tests.
var quitGrace = 2 * time.Second

// goroutineDump returns the start of the last goroutine dump (Go's answer
// to SIGQUIT) in the log at path, at most n bytes, or the log's tail when
// there is none.
func goroutineDump(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	i := bytes.LastIndex(b, []byte("SIGQUIT"))
	if i < 0 {
		return hostproc.TailFile(path, 2000)
	}
	b = b[i:]
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// Pause implements driver.Instance. One runsc call on the way; the state
// is only probed when runsc refuses (pausing a paused sandbox succeeds).
// runsc pause returns once every task of the sandbox is stopped.
func (i *Instance) Pause(ctx context.Context) error {
	if _, err := i.d.runsc(ctx, i, nil, "pause", i.id); err != nil {
		if st, serr := i.state(ctx); serr != nil || st.Status != "paused" {
			return err
		}
	}
	i.mu.Lock()
	i.paused = true
	i.mu.Unlock()
	return nil
}

// Resume implements driver.Instance (resuming a running sandbox succeeds).
// After a checkpoint taken while it was paused, the agent is told to
// reconnect as soon as it runs: its session died with the save, and
// without the signal it noticed only at its next keepalive (30 s).
func (i *Instance) Resume(ctx context.Context) error {
	if _, err := i.d.runsc(ctx, i, nil, "resume", i.id); err != nil {
		if st, serr := i.state(ctx); serr != nil || st.Status != "running" {
			return err
		}
	}
	i.mu.Lock()
	i.paused = false
	reconnect := i.reconnectOnResume
	i.reconnectOnResume = false
	i.mu.Unlock()
	if reconnect {
		i.reconnectAgent(nil) // its connections were closed at the checkpoint
	}
	return nil
}

type runscState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
}

func (i *Instance) state(ctx context.Context) (runscState, error) {
	out, err := i.d.runsc(ctx, i, nil, "state", i.id)
	if err != nil {
		return runscState{}, err
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("runsc state: %w", err)
	}
	return st, nil
}

// Wait implements driver.Instance. It waits on a pidfd of the sandbox's
// host process, so it works equally for a recovered instance.
func (i *Instance) Wait(ctx context.Context) (driver.ExitStatus, error) {
	i.mu.Lock()
	pid := i.pid
	i.mu.Unlock()
	if pid <= 0 {
		st, err := i.state(ctx)
		if err != nil {
			return driver.ExitStatus{Reason: "lost"}, nil
		}
		pid = st.Pid
	}
	if err := hostproc.WaitExit(ctx, pid); err != nil {
		return driver.ExitStatus{}, err
	}
	i.mu.Lock()
	destroyed := i.destroyed
	i.mu.Unlock()
	if destroyed {
		return driver.ExitStatus{Reason: "destroyed"}, nil
	}
	if i.oomKilled() {
		return driver.ExitStatus{Reason: "oom"}, nil
	}
	return driver.ExitStatus{Reason: "exited"}, nil
}

// Detach implements driver.Detacher: it closes the agent socket's
// listener and any unclaimed connection; the sandbox keeps running and its
// agent redials whoever listens next.
func (i *Instance) Detach() {
	i.mu.Lock()
	ln := i.ln
	i.ln = nil
	i.mu.Unlock()
	if ln != nil {
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
	}
	for {
		select {
		case c := <-i.conns:
			c.Close()
			continue
		default:
		}
		return
	}
}

// Prioritize implements driver.Prioritizer: the sandbox's cgroup gets the
// normal CPU share (cgroup v1 cpu.shares, or v2 cpu.weight).
func (i *Instance) Prioritize(ctx context.Context) error {
	if err := cgroup.Prioritize(i.id); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

// oomKilled reports whether the sandbox's memory cgroup recorded an OOM
// kill (cgroup v1 memory.oom_control or v2 memory.events).
func (i *Instance) oomKilled() bool {
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory/space", i.id, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup/space", i.id, "memory.events"),
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var n int
			if _, err := fmt.Sscanf(line, "oom_kill %d", &n); err == nil && n > 0 {
				return true
			}
		}
	}
	return false
}

// Destroy implements driver.Instance.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	if !i.destroyed {
		close(i.gone)
	}
	i.destroyed = true
	created := i.created
	i.mu.Unlock()
	i.Detach()
	var errs []error
	if created {
		// Bounded: a runsc that hangs (a stuck sandbox, a lock) is ended
		// and the sandbox's processes killed through its cgroup instead.
		dctx, cancel := context.WithTimeout(ctx, runscAnswerWithin)
		_, err := i.d.runsc(dctx, i, nil, "delete", "--force", i.id)
		cancel()
		if err != nil && !isNotExist(err) {
			// runsc could not (a state it cannot read): its processes
			// are ended through their cgroup, and with none left the
			// sandbox is gone whatever runsc says.
			if n, kerr := cgroup.Kill(i.id); kerr != nil {
				errs = append(errs, err)
			} else {
				i.log.Warn("runsc delete failed; the sandbox's processes were killed through its cgroup", "err", err, "killed", n)
			}
		}
	}
	if len(errs) == 0 {
		i.removeCgroups()
	}
	if i.stateDir != "" && len(errs) == 0 {
		if err := os.RemoveAll(i.stateDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the sandbox's cgroups. runsc removes them when it
// deletes a container it finished creating; one killed mid-start leaves
// them behind, empty. One left (still busy after the retries) is logged.
func (i *Instance) removeCgroups() {
	if err := cgroup.Remove(i.id); err != nil {
		i.log.Warn("sandbox cgroup left behind", "err", err)
	}
}

func isNotExist(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not found") || strings.Contains(s, "no such file")
}

// PinnedVersion is the gVisor release space is tested with; `make runsc`
// builds exactly this version from the Go module proxy (see Makefile), with
// the patches in third_party/gvisor applied.
const PinnedVersion = "v0.0.0-20260905035102-160fafc42237"

// runscFeatures reads the features file `make runsc` writes next to the
// binary (one name per line; none for a runsc built elsewhere).
func runscFeatures(runsc string) map[string]bool {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(runsc), "features"))
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for f := range strings.FieldsSeq(string(b)) {
		out[f] = true
	}
	return out
}

// BuildName names that build: the version and the patches' digest (as the
// Makefile's RUNSC_BUILD). The cached runsc is <cache>/runsc-<BuildName>/runsc.
func BuildName() string { return PinnedVersion + "-" + gvisorpatches.Digest() }
