package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/egress"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// CreateRequest is what a caller may ask for.
type CreateRequest struct {
	Template  string            `json:"template"`
	Driver    string            `json:"driver"`
	TimeoutS  int               `json:"timeout_s"`
	OnTimeout string            `json:"on_timeout"`
	Env       map[string]string `json:"env"`
	Metadata  map[string]string `json:"metadata"`
	CPU       int               `json:"cpu"`
	MemoryMB  int               `json:"memory_mb"`
	// DiskMB is the most host disk the sandbox's writable layer may fill
	// (0: DefaultDiskMB); it counts against the team's MaxDiskMB.
	DiskMB int `json:"disk_mb"`
	// Snapshot, when set, creates the sandbox from that snapshot.
	Snapshot string `json:"snapshot"`
	// SnapshotIntervalS overrides the server's automatic files snapshot
	// interval for this sandbox (-1: none); RetentionDays its history
	// retention (at most the server's).
	SnapshotIntervalS int `json:"snapshot_interval_s"`
	RetentionDays     int `json:"retention_days"`
	// Network is the egress policy; nil or empty: no network at all.
	Network *NetworkSpec `json:"network"`
	// Secrets names the team's secrets the sandbox may use: its env gets
	// an opaque placeholder for each, which the egress proxy swaps for
	// the value on the way to the secret's hosts only.
	Secrets []string `json:"secrets"`
	// PublicPorts lets anyone who knows a port's <port>-<id>.<domain> name
	// on the E2B listener reach it without a token (E2B's
	// allowPublicTraffic: true). Off by default; the /v1 port path always
	// needs the API key. Forks and restores of the sandbox keep it.
	PublicPorts bool `json:"public_ports"`
	// AutoResume: while the sandbox is paused (by its timeout with
	// on_timeout "pause", or by a caller), a request to its processes,
	// files or ports resumes it first (E2B's autoResume). Forks and
	// restores keep it.
	AutoResume bool `json:"auto_resume"`
	// SnapshotOnExec: a files snapshot after every command that changed
	// files, naming the command (nil: the server's default, off unless
	// space serve --snapshot-on-exec). Forks and restores keep it.
	SnapshotOnExec *bool `json:"snapshot_on_exec"`
	// KeepPrestarted keeps, in a sandbox claimed from a warm pool, the
	// process the pool started ahead of the claim (PoolConfig.Prestart:
	// the E2B code interpreter's kernel); it gets the sandbox's
	// environment at the claim. Without it the claim ends that process.
	// Set by the E2B facade, not part of the API.
	KeepPrestarted bool `json:"-"`
}

var (
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	metaKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.\-/]{1,128}$`)
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9_.\-]{0,63}$`)
)

func (s *Service) validateCreate(r *CreateRequest) error {
	if r.Template == "" {
		r.Template = s.cfg.DefaultTemplate
	}
	if !nameRE.MatchString(r.Template) {
		return errdefs.InvalidArgument("template: invalid name %q", r.Template)
	}
	if r.Driver == "" {
		r.Driver = s.cfg.DefaultDriver
	}
	if _, ok := s.drivers[r.Driver]; !ok {
		return errdefs.InvalidArgument("driver: %q is not available on this server", r.Driver)
	}
	if err := s.validateCommon(r); err != nil {
		return err
	}
	if r.TimeoutS == 0 {
		r.TimeoutS = int(s.cfg.DefaultTimeout.Seconds())
	}
	if r.OnTimeout == "" {
		r.OnTimeout = "kill"
	}
	if r.CPU < 0 || r.CPU > s.cfg.MaxCPU {
		return errdefs.InvalidArgument("cpu: must be between 1 and %d", s.cfg.MaxCPU)
	}
	if r.CPU == 0 {
		r.CPU = 1
	}
	if r.MemoryMB < 0 || r.MemoryMB > s.cfg.MaxMemoryMB || (r.MemoryMB != 0 && r.MemoryMB < 64) {
		return errdefs.InvalidArgument("memory_mb: must be between 64 and %d", s.cfg.MaxMemoryMB)
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = 512
	}
	if f, ok := s.drivers[r.Driver].(driver.MemoryFloor); ok && r.MemoryMB < f.MinMemoryMB() {
		return errdefs.InvalidArgument("memory_mb: the %s driver needs at least %d", r.Driver, f.MinMemoryMB())
	}
	if r.DiskMB < 0 || r.DiskMB > s.cfg.MaxDiskMB || (r.DiskMB != 0 && r.DiskMB < MinDiskMB) {
		return errdefs.InvalidArgument("disk_mb: must be between %d and %d", MinDiskMB, s.cfg.MaxDiskMB)
	}
	if r.DiskMB == 0 {
		r.DiskMB = min(DefaultDiskMB, s.cfg.MaxDiskMB)
	}
	return nil
}

// checkDiskFits refuses a disk_mb smaller than a VM driver's disk, which is
// its template image: the sandbox's qcow2 overlay over it can grow to the
// image's size whatever disk_mb says, and the team's disk quota would
// count less than the sandbox may fill. (gVisor's writable layer is made
// disk_mb large.)
func (s *Service) checkDiskFits(ctx context.Context, drv string, diskMB int, tpl store.Template) error {
	path, kind, err := s.rootfs(ctx, drv, tpl)
	if err != nil || kind != "raw" {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("template image: %w", err)
	}
	if imgMB := int((fi.Size() + 1<<20 - 1) >> 20); diskMB < imgMB {
		return errdefs.InvalidArgument("disk_mb: a %s sandbox's disk is its template image, %d MiB; ask for at least that", drv, imgMB)
	}
	return nil
}

// Disk reservations a create may ask for (disk_mb).
const (
	// DefaultDiskMB is a sandbox's disk when a create names none: the
	// 10 GiB every sandbox could fill before disk_mb existed.
	DefaultDiskMB = 10240
	// MinDiskMB is the smallest disk_mb a create may ask for.
	MinDiskMB = 256
)

// validateCommon checks what a create from a snapshot takes too.
func (s *Service) validateCommon(r *CreateRequest) error {
	if !s.timeoutOK(r.TimeoutS, false) {
		return errdefs.InvalidArgument("timeout_s: must be between 1 and %d", int(s.cfg.MaxTimeout.Seconds()))
	}
	switch r.OnTimeout {
	case "", "kill", "pause":
	default:
		return errdefs.InvalidArgument("on_timeout: must be kill or pause, got %q", r.OnTimeout)
	}
	if err := validateEnv(r.Env); err != nil {
		return err
	}
	if r.SnapshotIntervalS < -1 || r.SnapshotIntervalS > 7*86400 || (r.SnapshotIntervalS > 0 && r.SnapshotIntervalS < 60) {
		return errdefs.InvalidArgument("snapshot_interval_s: -1 (off) or 60 to 604800")
	}
	if r.RetentionDays < 0 || r.RetentionDays > 7 {
		return errdefs.InvalidArgument("retention_days: between 1 and 7")
	}
	if len(r.Metadata) > 64 {
		return errdefs.InvalidArgument("metadata: at most 64 entries")
	}
	for k, v := range r.Metadata {
		if !metaKeyRE.MatchString(k) || len(v) > 1024 || !utf8.ValidString(v) {
			return errdefs.InvalidArgument("metadata: invalid entry %q", k)
		}
	}
	return nil
}

// timeoutOK reports whether n seconds is a timeout this server takes
// (zero: the default, unless required), without overflowing a Duration.
func (s *Service) timeoutOK(n int, required bool) bool {
	if n < 0 || (required && n == 0) {
		return false
	}
	return int64(n) <= int64(s.cfg.MaxTimeout/time.Second)
}

func validateEnv(env map[string]string) error {
	if len(env) > 256 {
		return errdefs.InvalidArgument("env: at most 256 variables")
	}
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return errdefs.InvalidArgument("env: invalid variable name %q", k)
		}
		if len(v) > 32<<10 || !utf8.ValidString(v) || containsNUL(v) {
			return errdefs.InvalidArgument("env: invalid value for %q", k)
		}
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// readyTemplate returns the record of a template ready for creates. One
// not ready yet whose build is queued or running (a fresh server builds
// its default template, and with the E2B API the code interpreter's, at
// start) is waited for, at most Config.TemplateWait: then the create is
// refused with 503, saying it still builds.
func (s *Service) readyTemplate(ctx context.Context, name string) (store.Template, error) {
	tpl, err := s.store.GetTemplate(ctx, name)
	if err == nil && tpl.Status == store.TemplateReady {
		return tpl, nil
	}
	if s.cfg.AwaitTemplate != nil {
		wctx, cancel := context.WithTimeout(ctx, s.cfg.TemplateWait)
		waited, werr := s.cfg.AwaitTemplate(wctx, name)
		cancel()
		if waited && werr != nil {
			if ctx.Err() != nil {
				return store.Template{}, ctx.Err()
			}
			return store.Template{}, errdefs.Unavailable("template %q is still being built (waited %s); its progress is in GET /v1/templates: try again in a minute", name, s.cfg.TemplateWait)
		}
		if waited {
			tpl, err = s.store.GetTemplate(ctx, name)
		}
	}
	if err != nil {
		return store.Template{}, errdefs.NotFound("template %q not found", name)
	}
	if tpl.Status != store.TemplateReady {
		return store.Template{}, errdefs.Unavailable("template %q is %s", name, tpl.Status)
	}
	return tpl, nil
}

// Create makes and starts a sandbox. On any failure everything it made is
// rolled back (instance destroyed, record deleted) and the error returned.
func (s *Service) Create(ctx context.Context, c Caller, req CreateRequest) (store.Sandbox, error) {
	start := s.now()
	s.creating.Add(1)
	defer func() {
		s.lastCreate.Store(time.Now().UnixNano())
		s.creating.Add(-1)
	}()
	if req.Snapshot != "" {
		if req.Template != "" {
			return store.Sandbox{}, errdefs.InvalidArgument("template: give a template or a snapshot, not both")
		}
		if err := s.validateCommon(&req); err != nil {
			return store.Sandbox{}, err
		}
		return s.createFromSnapshot(ctx, c, req)
	}
	if err := s.validateCreate(&req); err != nil {
		return store.Sandbox{}, err
	}
	if err := s.validateNetwork(ctx, c, req.Network, req.Secrets); err != nil {
		return store.Sandbox{}, err
	}
	tpl, err := s.readyTemplate(ctx, req.Template)
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := s.checkDiskFits(ctx, req.Driver, req.DiskMB, tpl); err != nil {
		return store.Sandbox{}, err
	}
	now := s.now().UTC()
	sb := store.Sandbox{
		ID: newID(), Team: c.Team, Template: tpl.Name, TemplateDigest: tpl.Digest,
		Driver: req.Driver, State: StateCreating, Env: req.Env, Metadata: req.Metadata,
		CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, TimeoutS: req.TimeoutS, OnTimeout: req.OnTimeout,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Duration(req.TimeoutS) * time.Second),
		SnapshotIntervalS: req.SnapshotIntervalS, RetentionDays: req.RetentionDays, PublicPorts: req.PublicPorts, AutoResume: req.AutoResume,
		SnapshotOnExec: s.wantSnapshotOnExec(req.SnapshotOnExec),
	}
	if sb.Env == nil {
		sb.Env = map[string]string{}
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	quota, err := s.admit(ctx, sb.Team, 1, store.SizeOf(sb))
	if err != nil {
		return store.Sandbox{}, err
	}
	// Creation must finish or roll back even if the client goes away.
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	// A warm sandbox of this shape, started ahead of demand, is handed
	// over when there is one: only the identity remains to be given.
	if p := s.poolSet().get(shapeOf(sb)); p != nil {
		if w := p.take(); w != nil {
			out, err := s.claim(ctx, c, sb, req, p, w, quota)
			if errorsIs(err, errdefs.ErrQuotaExceeded) {
				return out, err // lost a race for the team's last place
			}
			if err == nil {
				s.metrics.CreateLatency.WithLabelValues(sb.Driver).Observe(s.now().Sub(start).Seconds())
				return out, nil
			}
			s.log.Warn("pooled sandbox could not be claimed; creating cold", "sandbox", w.sb.ID, "err", err)
		}
	}

	if err := s.store.CreateSandboxWithin(ctx, sb, quota); err != nil {
		return store.Sandbox{}, err
	}
	if err := s.putNetwork(ctx, sb.ID, req.Network, req.Secrets); err != nil {
		_ = s.store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		return store.Sandbox{}, err
	}
	log := s.log.With("sandbox", sb.ID)
	rollback := func(undo func() error, cause error) (store.Sandbox, error) {
		if undo != nil {
			cause = leftBehind(cause, undo())
		}
		s.dropNetwork(sb.ID)
		s.dropFailed(context.WithoutCancel(ctx), sb.ID, []string{StateCreating}, cause)
		log.Warn("create failed", "err", cause)
		s.metrics.CreateErrors.Inc()
		return store.Sandbox{}, cause
	}
	inst, agent, undo, err := s.boot(ctx, sb, tpl, false)
	if err != nil {
		return rollback(nil, err)
	}
	// The hostname is the driver's business (set in the spec); Init
	// carries the identity the agent hands to every process, and the
	// egress endpoint when the sandbox has a network.
	if err := s.initAgent(ctx, sb, agent, agentproto.InitRequest{}, true); err != nil {
		return rollback(undo, fmt.Errorf("sandbox agent did not come up: %v: %w", err, errdefs.ErrUnavailable))
	}
	if err := s.goLive(ctx, sb.ID, inst, agent); err != nil {
		return rollback(undo, err)
	}
	s.metrics.CreateLatency.WithLabelValues(sb.Driver).Observe(s.now().Sub(start).Seconds())
	log.Info("sandbox created", "template", sb.Template, "driver", sb.Driver, "ms", s.now().Sub(start).Milliseconds())
	return s.store.GetSandbox(ctx, sb.ID)
}

// boot creates and starts the instance of a recorded sandbox and connects
// to its agent; low starts it at the lowest CPU priority (a warm pool's
// boot). On error everything it made is gone; on success undo destroys it.
func (s *Service) boot(ctx context.Context, sb store.Sandbox, tpl store.Template, low bool) (driver.Instance, *agentclient.Client, func() error, error) {
	log := s.log.With("sandbox", sb.ID)
	d := s.drivers[sb.Driver]
	rootfs, kind, err := s.rootfs(ctx, sb.Driver, tpl)
	if err != nil {
		return nil, nil, nil, err
	}
	spec := driver.Spec{
		ID: sb.ID, Hostname: "sandbox", Rootfs: rootfs, RootfsKind: kind,
		StateDir: s.stateDir(sb.ID), AgentPath: s.cfg.AgentPath,
		VCPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, LowPriority: low,
	}
	inst, err := d.Create(ctx, spec)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create sandbox: %v: %w", err, errdefs.ErrUnavailable)
	}
	var agent *agentclient.Client
	undo := func() error {
		if agent != nil {
			agent.Close()
		}
		err := inst.Destroy(context.WithoutCancel(ctx))
		if err != nil {
			log.Error("rollback: destroy", "err", err)
		}
		return err
	}
	h, _ := json.Marshal(inst.Handle())
	if err := s.store.SetSandboxHandle(ctx, sb.ID, h); err != nil {
		return nil, nil, nil, leftBehind(err, undo())
	}
	if err := inst.Start(ctx); err != nil {
		return nil, nil, nil, leftBehind(fmt.Errorf("start sandbox: %v: %w", err, errdefs.ErrUnavailable), undo())
	}
	agent = agentclient.New(inst.DialAgent, log)
	if _, err := agent.Info(ctx); err != nil {
		return nil, nil, nil, leftBehind(fmt.Errorf("sandbox agent did not come up: %v: %w", err, errdefs.ErrUnavailable), undo())
	}
	return inst, agent, undo, nil
}

// leftBehindError is a failed create, fork or boot whose instance could
// not be destroyed: it may still run, so its record (with the handle a
// kill or a restart's recovery destroys it by) must stay.
type leftBehindError struct {
	cause, destroy error
}

func (e *leftBehindError) Error() string {
	return fmt.Sprintf("%v (and its instance could not be destroyed: %v)", e.cause, e.destroy)
}

func (e *leftBehindError) Unwrap() error { return e.cause }

// leftBehind is cause, marked as having left its instance behind when
// destroyErr (the rollback's destroy) is not nil.
func leftBehind(cause, destroyErr error) error {
	if destroyErr == nil {
		return cause
	}
	return &leftBehindError{cause: cause, destroy: destroyErr}
}

// dropFailed removes the record of a sandbox whose create (or fork, or
// warm boot) failed in one of states, unless the failure left its
// instance behind: that record is kept in state error, so the sandbox is
// listed, counts against its team's quota while it may hold resources,
// and a kill (or the next server start) destroys it. A deleted record
// left a running sandbox nothing would ever stop.
func (s *Service) dropFailed(ctx context.Context, id string, states []string, cause error) {
	var lb *leftBehindError
	if errors.As(cause, &lb) {
		if err := s.store.UpdateSandboxState(ctx, id, states, StateError, lb.Error()); err != nil {
			s.log.Error("failed sandbox left behind: mark error", "sandbox", id, "err", err)
		}
		return
	}
	if err := s.store.DeleteSandbox(ctx, id); err != nil {
		s.log.Error("rollback: delete record", "sandbox", id, "err", err)
	}
}

// goLive registers a sandbox whose agent has its identity and moves it
// from creating to running.
func (s *Service) goLive(ctx context.Context, id string, inst driver.Instance, agent *agentclient.Client) error {
	l := &live{inst: inst, agent: agent}
	s.mu.Lock()
	s.live[id] = l
	s.mu.Unlock()
	if err := s.store.UpdateSandboxState(ctx, id, []string{StateCreating}, StateRunning, ""); err != nil {
		s.mu.Lock()
		delete(s.live, id)
		s.mu.Unlock()
		return err
	}
	s.watch(id, l, nil)
	return nil
}

// watch marks the sandbox stopped when its instance ends on its own (the
// agent exited, the sandbox was OOM-killed, someone killed runsc), and,
// where the driver needs it, frees memory when the sandbox reaches its
// memory (see driver.MemoryWatcher). memWatch, when not nil, ends a memory
// watch registered before (a warm sandbox's: see prewatch); watch then
// registers none and ends that one when the instance ends.
func (s *Service) watch(id string, l *live, memWatch context.CancelFunc) {
	go func() {
		// Registered here, off the create path: a cgroup v1 threshold
		// registration waits for an RCU grace period (milliseconds; it
		// doubled the warm create's p50 when done before answering).
		if memWatch != nil {
			defer memWatch()
		} else if mw, ok := l.inst.(driver.MemoryWatcher); ok {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := mw.WatchMemory(ctx, func() int64 { return s.reclaimMemory(id, l.agent) }); err != nil {
				s.mu.Lock()
				gone := s.live[id] != l
				s.mu.Unlock()
				if gone { // destroyed before its watch was registered (its cgroup went with it)
					s.log.Debug("no memory watch: the sandbox is gone", "sandbox", id, "err", err)
				} else {
					s.log.Warn("no memory watch: a process past the sandbox's memory stops the sandbox", "sandbox", id, "err", err)
				}
			}
		}
		st, err := l.inst.Wait(context.Background())
		if err != nil || st.Reason == "destroyed" {
			return
		}
		s.mu.Lock()
		cur := s.live[id]
		s.mu.Unlock()
		if cur != l {
			return // destroyed or replaced through the service
		}
		s.log.Warn("sandbox stopped on its own", "sandbox", id, "reason", st.Reason)
		_ = s.destroy(context.Background(), id, l, st.Reason)
	}()
}

// reclaimMemory runs when a sandbox's memory use reached its memory: the
// agent kills the process using the most (its exit reports error "oom"),
// so the sandbox lives on where the host would have stopped all of it. It
// returns the killed process's resident memory (0: nothing was killed).
func (s *Service) reclaimMemory(id string, agent *agentclient.Client) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := agent.Reclaim(ctx)
	switch {
	case err != nil:
		s.log.Warn("sandbox at its memory limit; the agent could not free memory", "sandbox", id, "err", err)
	case v.PID != 0:
		s.metrics.OOMKills.Inc()
		s.log.Info("sandbox at its memory limit: killed its largest process", "sandbox", id, "pid", v.PID, "cmd", v.Cmd, "rss_bytes", v.RSS)
		return v.RSS
	}
	return 0
}

// putNetwork records a new sandbox's network policy and the names of its
// secrets (placeholders are minted when the agent is initialised).
func (s *Service) putNetwork(ctx context.Context, id string, spec *NetworkSpec, secrets []string) error {
	if (spec == nil || spec.empty()) && len(secrets) == 0 {
		return nil
	}
	n := store.Network{SandboxID: id, Secrets: map[string]string{}}
	if spec != nil {
		n.Allow, n.Deny = strings.Join(spec.Allow, ","), strings.Join(spec.Deny, ",")
	}
	for _, name := range secrets {
		// Minted again when bound to the agent (initAgent); minted here
		// too, so a record bound before that (Recover, after a crash
		// between a warm claim and its delivery) never maps a name.
		n.Secrets[egress.NewPlaceholder()] = name
	}
	return s.store.PutNetwork(ctx, n)
}
