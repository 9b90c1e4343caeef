// Package sandbox is the domain of space: a sandbox's state machine and every
// operation on it (create, exec, files, timeout, destroy, recovery after a
// server restart), on top of the driver contract, the guest agent client and
// the durable store. HTTP and the E2B facade call this package; it never
// knows about HTTP.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// States of a sandbox. Legal transitions:
//
//	creating → running | error
//	running  → paused | stopping
//	paused   → running | stopping
//	error    → stopping
//	stopping → stopped
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateError    = "error"
)

// Live states hold host resources.
var liveStates = []string{StateCreating, StateRunning, StatePaused, StateStopping, StateError, StatePooled}

// Config configures the service.
type Config struct {
	DataDir         string // sandbox state dirs live in DataDir/sandboxes/<id>
	AgentPath       string
	DefaultDriver   string
	DefaultTemplate string
	DefaultTimeout  time.Duration
	MaxTimeout      time.Duration
	// Limits a create may ask for.
	MaxCPU      int
	MaxMemoryMB int
	// MaxDiskMB is the largest disk_mb a create may ask for (default
	// DefaultDiskMB).
	MaxDiskMB int
	// TeamQuota applies to every team without a quota of its own (zero
	// fields: no limit).
	TeamQuota store.Quota
	// ReserveMemoryMB is the host memory (MemAvailable) kept free: below it
	// creates are refused and pools do not refill. 0: no reserve.
	ReserveMemoryMB int
	// ReserveDiskMB is the free space kept on DataDir's filesystem: below
	// it creates and snapshots are refused (507) and pools do not refill.
	// 0: no reserve.
	ReserveDiskMB int
	// StoppedRetention is how long records of stopped sandboxes are kept.
	StoppedRetention time.Duration
	// Rootfs resolves a template into what a driver boots (path and
	// RootfsKind); nil: the template directory for every driver.
	Rootfs func(ctx context.Context, driver string, tpl store.Template) (path, kind string, err error)
	// AwaitTemplate, when set, blocks while a build of the named template
	// is queued or running (until ctx ends) and reports whether there was
	// one: a create of a template not ready yet waits for it
	// (TemplateWait at most) instead of failing at once.
	AwaitTemplate func(ctx context.Context, name string) (bool, error)
	// TemplateWait bounds that wait (0: 50 s).
	TemplateWait time.Duration
}

// DefaultMaxCPU is the most CPUs a create may ask for unless
// Config.MaxCPU says otherwise.
const DefaultMaxCPU = 8

// Service owns every sandbox of one server.
type Service struct {
	cfg     Config
	store   *store.Store
	drivers map[string]driver.Driver
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu   sync.Mutex
	live map[string]*live // by sandbox id
	// closing is set by Shutdown.
	closing atomic.Bool

	poolsMu sync.Mutex
	pools   *pools // read through poolSet
	poolCtx context.Context
	// poolsStopped: StopPools ran; no pool starts after it.
	poolsStopped bool
	// poolImageSeq numbers pool images: each pool has its own, so a pool
	// retiring in the background never removes its successor's.
	poolImageSeq atomic.Int64

	snaps  *Snapshots   // nil: snapshots disabled
	egress *egressState // nil: no network for any sandbox
	tplMu  sync.Mutex   // one template indexing at a time
	// pins counts the operations reading each snapshot's content
	// (pinSnapshot); pinMu guards it and is held while a snapshot is
	// dropped, so a drop and a pin never interleave.
	pinMu sync.Mutex
	pins  map[string]int
	// tplIndexing holds the template digests whose full view has been
	// started in the background (prepareTemplateView).
	tplIndexing sync.Map
	// bg lives until Shutdown: background work of the service's own
	// (template indexing) runs under it, and Shutdown waits for bgWG.
	bg     context.Context
	bgStop context.CancelFunc
	bgWG   sync.WaitGroup
	bgMu   sync.Mutex // orders bgWG.Add before Shutdown's Wait

	procs *procLog // process history, written off the exec path

	// creating counts creates in flight and lastCreate is when the last
	// one ended (unix ns): background work a create causes (a claim's
	// identity delivery, a pool refill) waits for the burst to end.
	creating   atomic.Int64
	lastCreate atomic.Int64
	// lastUse is when a request last reached a live sandbox (liveOf, unix
	// ns): a pool refill that is not urgent waits for a quiet moment.
	lastUse atomic.Int64

	quotas   quotaCache // teams' own quotas, as the store has them
	rates    rateLimits // teams' API request buckets (AllowRequest)
	hostMem  *gauge     // the host's available memory (MiB), for the reserve
	hostDisk *gauge     // free space under DataDir (MiB), for the disk reserve
	snapUse  snapUsage  // teams' snapshot data, for their snapshot quotas
}

func isConflict(err error) bool { return errors.Is(err, errdefs.ErrConflict) }

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// live is the in-memory half of a sandbox with host resources.
type live struct {
	inst  driver.Instance
	agent *agentclient.Client
	// opMu serialises lifecycle operations (pause, resume, destroy) on one
	// sandbox; exec and files do not take it.
	opMu sync.Mutex
	// ready, when not nil, is closed once the sandbox has its identity
	// (a warm claim delivers it after answering the create: see claim);
	// initErr then says whether that failed.
	ready   chan struct{}
	initErr error
	// urgent, when not nil, is closed (hurry) by the first request or
	// operation that needs the identity: its delivery stops waiting for
	// the create burst to end.
	urgent     chan struct{}
	urgentOnce sync.Once
	// streams counts the output streams open on the sandbox (follows,
	// SSE execs, terminals): at most maxStreams, each holding an agent
	// stream and up to its window of output in the server.
	streams atomic.Int32
	// baselined: a snapshot_on_exec sandbox has a snapshot to go back to
	// before its first command (execsnap.go).
	baselined atomic.Bool
	// conns counts the connections to the sandbox's ports open through
	// the agent (preview traffic): at most maxPortConns.
	conns atomic.Int32
	// autoTried is when the rolling history last tried an automatic
	// snapshot that left no point (the files were unchanged, or it
	// failed); the next try waits a whole interval from then
	// (AutoSnapshotOnce; guarded by opMu).
	autoTried time.Time
}

// hurry asks for the identity now.
func (l *live) hurry() {
	if l.urgent != nil {
		l.urgentOnce.Do(func() { close(l.urgent) })
	}
}

// lockOp takes the lifecycle lock, first hurrying a pending identity
// delivery (which holds the lock until it is done).
func (l *live) lockOp() {
	l.hurry()
	l.opMu.Lock()
}

// wait blocks until the sandbox has its identity.
func (l *live) wait(ctx context.Context) error {
	if l.ready == nil {
		return nil
	}
	l.hurry()
	select {
	case <-l.ready:
		return l.initErr
	case <-ctx.Done():
		return fmt.Errorf("sandbox is still starting: %w: %w", errdefs.ErrUnavailable, ctx.Err())
	}
}

// New returns a service; call Recover before serving requests.
func New(cfg Config, st *store.Store, drivers []driver.Driver, log *slog.Logger, m *Metrics) *Service {
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = 5 * time.Minute
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxCPU == 0 {
		cfg.MaxCPU = DefaultMaxCPU
	}
	if cfg.MaxMemoryMB == 0 {
		cfg.MaxMemoryMB = 16384
	}
	if cfg.TemplateWait == 0 {
		cfg.TemplateWait = 50 * time.Second
	}
	if cfg.MaxDiskMB == 0 {
		cfg.MaxDiskMB = DefaultDiskMB
	}
	if cfg.StoppedRetention == 0 {
		cfg.StoppedRetention = 24 * time.Hour
	}
	s := &Service{cfg: cfg, store: st, drivers: map[string]driver.Driver{}, log: log, metrics: m, now: time.Now, live: map[string]*live{},
		hostMem:  &gauge{ttl: 100 * time.Millisecond, read: hostAvailableMB},
		hostDisk: &gauge{ttl: time.Second, read: func() (int64, bool) { return dirAvailableMB(cfg.DataDir) }}}
	s.procs = newProcLog(st, log)
	s.bg, s.bgStop = context.WithCancel(context.Background())
	for _, d := range drivers {
		s.drivers[d.Name()] = d
	}
	return s
}

// Caller identifies who asks: a team sees and touches only its own
// sandboxes; an admin sees all.
type Caller struct {
	Team  string
	Admin bool
}

func (c Caller) owns(sb store.Sandbox) bool { return c.Admin || sb.Team == c.Team }

// get loads a sandbox the caller may see; others' are not found.
func (s *Service) get(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	if !validID(id) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %q not found", id)
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	if !c.owns(sb) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %q not found", id)
	}
	return sb, nil
}

// liveOf returns the live half of a sandbox in one of the given states.
func (s *Service) liveOf(ctx context.Context, c Caller, id string, states ...string) (store.Sandbox, *live, error) {
	sb, err := s.get(ctx, c, id)
	if err != nil {
		return sb, nil, err
	}
	ok := false
	for _, st := range states {
		ok = ok || sb.State == st
	}
	if !ok {
		return sb, nil, stateConflict(sb.State, "sandbox %s is %s", id, sb.State)
	}
	s.mu.Lock()
	l := s.live[id]
	s.mu.Unlock()
	if l == nil {
		return sb, nil, errdefs.Unavailable("sandbox %s is not attached yet", id)
	}
	if err := l.wait(ctx); err != nil {
		return sb, nil, err
	}
	s.lastUse.Store(time.Now().UnixNano())
	return sb, l, nil
}

// Wakeable reports whether a request into sb resumes it: it is paused and
// was created with auto_resume.
func Wakeable(sb store.Sandbox) bool { return sb.State == StatePaused && sb.AutoResume }

// Wake resumes a paused sandbox created with auto_resume (a request for
// it arrived) and returns when it runs; for any other sandbox it only
// checks that it runs.
func (s *Service) Wake(ctx context.Context, c Caller, id string) error {
	_, _, err := s.liveRunning(ctx, c, id)
	return err
}

// liveRunning is liveOf for a running sandbox, for requests that reach
// into it (processes, files, ports): a paused sandbox created with
// auto_resume is resumed first (E2B's autoResume). Other operations
// (pause, snapshot, fork, metrics) still see it paused.
func (s *Service) liveRunning(ctx context.Context, c Caller, id string) (store.Sandbox, *live, error) {
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err == nil || !Wakeable(sb) {
		return sb, l, err
	}
	var ce *ConflictError
	if _, err := s.Resume(ctx, c, id); err == nil {
		s.log.Info("sandbox woken by a request (auto_resume)", "sandbox", id)
	} else if !errors.As(err, &ce) || ce.State != StateRunning { // running: another request woke it first
		return sb, nil, err
	}
	return s.liveOf(ctx, c, id, StateRunning)
}

func (s *Service) stateDir(id string) string {
	return filepath.Join(s.cfg.DataDir, "sandboxes", id)
}

// ConflictError is a conflict that names the sandbox's current state.
type ConflictError struct {
	State string
	msg   string
}

func (e *ConflictError) Error() string { return e.msg }
func (e *ConflictError) Unwrap() error { return errdefs.ErrConflict }

func stateConflict(state, format string, args ...any) error {
	return &ConflictError{State: state, msg: fmt.Sprintf(format, args...)}
}

var idEnc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func newID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "sb-" + idEnc.EncodeToString(b)
}

func validID(id string) bool {
	if len(id) < 4 || len(id) > 64 || !strings.HasPrefix(id, "sb-") {
		return false
	}
	for _, r := range id[3:] {
		if !(r >= 'a' && r <= 'z' || r >= '2' && r <= '7') {
			return false
		}
	}
	return true
}

// rootfs returns the template in the form driver drv boots.
func (s *Service) rootfs(ctx context.Context, drv string, tpl store.Template) (string, string, error) {
	if s.cfg.Rootfs == nil {
		return tpl.Path, tpl.Kind, nil
	}
	p, k, err := s.cfg.Rootfs(ctx, drv, tpl)
	if err != nil {
		return "", "", fmt.Errorf("prepare template %s for %s: %v: %w", tpl.Name, drv, err, errdefs.ErrUnavailable)
	}
	return p, k, nil
}
