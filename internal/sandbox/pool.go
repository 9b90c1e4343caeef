package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// StatePooled is a sandbox started ahead of demand: it has no owner, no
// identity and no timeout, and is never listed. A claim gives it all three
// and makes it a normal sandbox; a pooled sandbox is never reused after a
// claim, and nothing of one caller ever reaches another.
const StatePooled = "pooled"

// PoolConfig sizes the warm pools.
type PoolConfig struct {
	// Template names the template the pool's sandboxes are made from
	// (for its owner, which calls StartPool with that template's record;
	// StartPool itself uses the record it is given).
	Template string
	// Size is how many warm sandboxes of the shape are kept ready (0: no
	// pool).
	Size int
	// Max caps the adaptive target (default 4×Size).
	Max int
	// Driver is the pooled sandboxes' driver ("": the server's default);
	// MemoryMB their memory (0: a create's default).
	Driver   string
	MemoryMB int
	// CPU is their CPUs (0: a create's default).
	CPU int
	// FromImage refills the pool by restoring one post-boot checkpoint of
	// its shape instead of booting (poolimage.go): for drivers whose
	// restore is faster than their boot (QEMU). Without a usable image
	// the pool boots, as it does without FromImage.
	FromImage bool
	// Prestart, when set, is a process started in each of the pool's
	// sandboxes before it joins the pool (prestart.go).
	Prestart *Prestart
	// Source says where the configuration came from, for operators
	// ("flags", "api"; shown in PoolStatus).
	Source string
}

// shape is what must match for a pooled sandbox to serve a create.
// Pooled sandboxes have the default disk (a create that asks for another
// disk_mb boots cold).
type shape struct {
	digest, driver        string
	cpu, memoryMB, diskMB int
}

func shapeOf(sb store.Sandbox) shape {
	return shape{digest: sb.TemplateDigest, driver: sb.Driver, cpu: sb.CPU, memoryMB: sb.MemoryMB, diskMB: sb.DiskMB}
}

// warm is one pooled sandbox: booted, agent connected, no identity.
type warm struct {
	sb    store.Sandbox
	inst  driver.Instance
	agent *agentclient.Client
	// restored: made from the pool's image, not booted.
	restored bool
	// stopMemWatch ends the memory watch registered when the sandbox was
	// made (prewatch); nil when none was.
	stopMemWatch context.CancelFunc
	// dead is set when the instance stopped while it waited in the pool
	// (watchWarm); stopWait ends that watch (nil when none was started).
	dead     atomic.Bool
	stopWait context.CancelFunc
}

// pool keeps warm sandboxes of one shape.
type pool struct {
	s     *Service
	shape shape
	tpl   store.Template
	ready chan *warm
	kick  chan struct{}
	img   *poolImage // nil: the pool refills by booting
	// prestart is started in every sandbox before it joins the pool.
	prestart *Prestart
	target   atomic.Int64
	// cancel stops fill, which closes done when it returned.
	cancel context.CancelFunc
	done   chan struct{}
	// demand holds the times of recent creates of the pool's shape,
	// served from it or not, for the adaptive target.
	mu sync.Mutex
	// base is the size it keeps at the least, max the most its target
	// grows to, source where they came from (SetPool changes all three).
	base, max int
	source    string
	demand    []time.Time
	boot      time.Duration // last boot time
	// starved is set (by fill only) while the host is below its memory
	// reserve, so the refusal is logged once.
	starved bool
	// purgeDead is set when a warm sandbox was found stopped (watchWarm):
	// fill's next round takes the dead out of ready (purge).
	purgeDead atomic.Bool
}

type pools struct {
	mu    sync.Mutex
	byKey map[shape]*pool
	// closed: StopPools began; nothing starts under wg any more. Every
	// wg.Go happens under mu after checking it, so StopPools's wait
	// covers all of them.
	closed bool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// poolSet is the running pools, nil before the first started.
func (s *Service) poolSet() *pools {
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	return s.pools
}

func (ps *pools) get(k shape) *pool {
	if ps == nil {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.byKey[k]
}

// MaxPoolSize caps a pool's Size; its adaptive target grows to at most
// MaxPoolTarget (what a pool's ready channel holds).
const (
	MaxPoolSize   = 64
	MaxPoolTarget = 4 * MaxPoolSize
)

// CheckPool validates cfg as StartPool and SetPool take it and returns it
// with its driver, CPUs and memory resolved (a create's defaults where
// they are zero) and Max defaulted (4×Size, at most MaxPoolTarget).
// Errors: errdefs.ErrInvalidArgument.
func (s *Service) CheckPool(cfg PoolConfig) (PoolConfig, error) {
	if cfg.Size < 0 || cfg.Size > MaxPoolSize {
		return cfg, errdefs.InvalidArgument("pool size %d: want 0 to %d", cfg.Size, MaxPoolSize)
	}
	if cfg.Size == 0 && cfg.Max != 0 {
		return cfg, errdefs.InvalidArgument("pool max %d: a pool of size 0 is off; leave max out", cfg.Max)
	}
	if cfg.Max != 0 && (cfg.Max < cfg.Size || cfg.Max > MaxPoolTarget) {
		return cfg, errdefs.InvalidArgument("pool max %d: want the size (%d) to %d, or 0 for 4×size", cfg.Max, cfg.Size, MaxPoolTarget)
	}
	if cfg.Max == 0 {
		cfg.Max = min(4*cfg.Size, MaxPoolTarget)
	}
	req := CreateRequest{Template: cfg.Template, Driver: cfg.Driver, MemoryMB: cfg.MemoryMB, CPU: cfg.CPU}
	if err := s.validateCreate(&req); err != nil {
		return cfg, err
	}
	cfg.Driver, cfg.CPU, cfg.MemoryMB = req.Driver, req.CPU, req.MemoryMB
	return cfg, nil
}

// StartPool keeps cfg.Size warm sandboxes of template tpl, cfg's driver
// and size, refilling in the background and growing the target with the
// create rate: SetPool for a size above 0, with errors logged. Starting a
// pool that runs already does nothing; a pool of the same template name
// built from another digest (the template was rebuilt from a new recipe)
// is retired: creates look for the new digest, so its sandboxes would
// never be claimed. StopPools drains them all.
func (s *Service) StartPool(ctx context.Context, tpl store.Template, cfg PoolConfig) {
	if cfg.Size <= 0 {
		return
	}
	if err := s.SetPool(ctx, tpl, cfg); err != nil {
		s.log.Error("warm pool not started", "template", tpl.Name, "err", err)
	}
}

// SetPool makes the pools of tpl on cfg's driver what cfg says, while the
// server runs: a running pool of the same shape takes the new size and
// max at once (its warm sandboxes stay; those above the new target leave
// it now, not after the shrink delay, and are destroyed in the
// background); a pool of another shape
// (CPUs, memory, or an older build of the template), or one that starts
// a process where cfg starts none or the other way round, is retired and
// one of cfg's started; a Size of 0 stops the template's pool on that
// driver and destroys its warm sandboxes. Errors: as CheckPool.
func (s *Service) SetPool(ctx context.Context, tpl store.Template, cfg PoolConfig) error {
	cfg.Template = tpl.Name
	cfg, err := s.CheckPool(cfg)
	if err != nil {
		return err
	}
	if cfg.Size == 0 {
		s.StopPool(tpl.Name, cfg.Driver)
		return nil
	}
	s.startPool(ctx, tpl, cfg)
	return nil
}

// StopPool stops the pools of a template on a driver: creates no longer
// find them at once, and their warm sandboxes are destroyed in the
// background, after a refill in flight (never cut short) ended.
func (s *Service) StopPool(template, drv string) {
	ps := s.poolSet()
	if ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return
	}
	for k, p := range ps.byKey {
		if p.tpl.Name == template && k.driver == drv {
			delete(ps.byKey, k)
			ps.wg.Go(func() { s.retirePool(p) })
		}
	}
}

// startPool starts cfg's pool (cfg checked): a running pool of the same
// shape takes cfg's size and max, and every other pool of the template on
// the driver is retired.
func (s *Service) startPool(ctx context.Context, tpl store.Template, cfg PoolConfig) {
	k := shape{digest: tpl.Digest, driver: cfg.Driver, cpu: cfg.CPU, memoryMB: cfg.MemoryMB, diskMB: s.poolDiskMB()}
	s.poolsMu.Lock()
	if s.poolsStopped {
		// The server is shutting down (a template build that ended
		// after Shutdown began): no pool may start behind StopPools.
		s.poolsMu.Unlock()
		return
	}
	if s.pools == nil {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.pools = &pools{byKey: map[shape]*pool{}, cancel: cancel}
		s.poolCtx = pctx
		// Images a crashed server left behind (a clean stop removes them).
		_ = os.RemoveAll(s.poolImagesDir())
	}
	ps := s.pools
	s.poolsMu.Unlock()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return
	}
	for old, op := range ps.byKey {
		if op.tpl.Name != tpl.Name || old.driver != k.driver || old == k {
			continue
		}
		delete(ps.byKey, old)
		ps.wg.Go(func() { s.retirePool(op) })
	}
	if p := ps.byKey[k]; p != nil && (p.prestart == nil) != (cfg.Prestart == nil) {
		// Its sandboxes were made with (or without) a process that the
		// new setting does not want: a new pool makes them again.
		delete(ps.byKey, k)
		ps.wg.Go(func() { s.retirePool(p) })
	}
	if p := ps.byKey[k]; p != nil {
		p.resize(cfg, &ps.wg)
		return
	}
	pctx, cancel := context.WithCancel(s.poolCtx)
	p := &pool{
		s: s, shape: k, tpl: tpl, base: cfg.Size, max: cfg.Max, source: cfg.Source,
		ready: make(chan *warm, MaxPoolTarget), kick: make(chan struct{}, 1),
		cancel: cancel, done: make(chan struct{}), prestart: cfg.Prestart,
	}
	if cfg.FromImage {
		_, canRestore := s.drivers[k.driver].(driver.Restorer)
		if canRestore {
			p.img = s.newPoolImage(k)
		} else {
			s.log.Warn("warm pool: driver cannot restore; refilling by booting", "driver", k.driver)
		}
	}
	p.target.Store(int64(cfg.Size))
	ps.byKey[k] = p
	s.log.Info("warm pool started", "template", tpl.Name, "driver", k.driver, "size", cfg.Size, "max", cfg.Max, "memory_mb", k.memoryMB, "from_image", p.img != nil)
	ps.wg.Go(func() {
		defer close(p.done)
		p.fill(pctx)
	})
}

// resize gives a running pool a new size and max: its target follows at
// once, warm sandboxes above it leave the pool now (destroyed in the
// background, under wg, so the caller does not wait for them), and a grown
// pool starts refilling. The caller holds the pools' mu (see pools.closed).
func (p *pool) resize(cfg PoolConfig, wg *sync.WaitGroup) {
	p.mu.Lock()
	changed := p.base != cfg.Size || p.max != cfg.Max
	p.base, p.max, p.source = cfg.Size, cfg.Max, cfg.Source
	p.mu.Unlock()
	if !changed {
		return
	}
	p.adapt()
	var surplus []*warm
	for int64(len(p.ready)) > p.target.Load() {
		select {
		case w := <-p.ready:
			surplus = append(surplus, w)
			continue
		default:
		}
		break
	}
	if len(surplus) > 0 {
		wg.Go(func() {
			for _, w := range surplus {
				p.s.discardWarm(w)
			}
		})
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
	p.s.log.Info("warm pool resized", "template", p.tpl.Name, "driver", p.shape.driver, "size", cfg.Size, "max", cfg.Max, "target", p.target.Load(), "destroyed", len(surplus))
}

// take returns a warm sandbox, or nil when the pool is empty (the caller
// then creates cold: a create never waits for the pool). Either way the
// create counts as demand: a burst that empties the pool grows its target
// by all its creates, not only by those it could serve.
func (p *pool) take() *warm {
	p.mu.Lock()
	p.demand = append(p.demand, time.Now())
	p.mu.Unlock()
	for {
		select {
		case w := <-p.ready:
			select {
			case p.kick <- struct{}{}:
			default:
			}
			if w.dead.Load() {
				// Stopped while it waited (watchWarm): never handed out.
				p.s.discardWarm(w)
				continue
			}
			if w.stopWait != nil {
				w.stopWait() // the claimed sandbox's own watch follows
			}
			return w
		default:
			return nil
		}
	}
}

// giveBack returns a warm sandbox a claim took but did not change to the
// pool; it is destroyed when the pool is full again, and a pool retired
// meanwhile (its drain may have run before w came back) is drained again.
func (p *pool) giveBack(w *warm) {
	p.watchWarm(w)
	select {
	case p.ready <- w:
	default:
		p.s.discardWarm(w)
		return
	}
	select {
	case <-p.done:
		for {
			select {
			case w := <-p.ready:
				p.s.discardWarm(w)
			default:
				return
			}
		}
	default:
	}
}

// watchWarm marks w dead when its instance stops while it waits in the
// pool (the host's OOM killer, a crash): take skips it and fill takes it
// out and boots a replacement, so a create never gets a sandbox that is
// gone (it would answer 201, then fail its identity and be destroyed).
func (p *pool) watchWarm(w *warm) {
	ctx, cancel := context.WithCancel(context.Background())
	w.stopWait = cancel
	go func() {
		st, err := w.inst.Wait(ctx)
		if err != nil || ctx.Err() != nil {
			return // claimed or discarded
		}
		w.dead.Store(true)
		p.purgeDead.Store(true)
		p.s.log.Warn("warm pool: a waiting sandbox stopped; replacing it", "sandbox", w.sb.ID, "driver", p.shape.driver, "reason", st.Reason)
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}()
}

// purge takes the dead out of ready and destroys them (fill only, so a
// drain, which runs once fill returned, misses none it holds).
func (p *pool) purge() {
	var live []*warm
	for {
		select {
		case w := <-p.ready:
			if w.dead.Load() {
				p.s.discardWarm(w)
			} else {
				live = append(live, w)
			}
			continue
		default:
		}
		break
	}
	for _, w := range live {
		select {
		case p.ready <- w:
		default:
			p.s.discardWarm(w)
		}
	}
}

// adapt sets the target from the creates of the last 30 s: enough warm
// sandboxes to cover the creates expected while one boots, twice over,
// rounded (rounded up, one claim in a quiet pool made it boot two
// replacements for 30 s: ~0.5 s of CPU and a sandbox's memory for
// nothing).
func (p *pool) adapt() {
	p.mu.Lock()
	defer p.mu.Unlock()
	cut := time.Now().Add(-30 * time.Second)
	i := 0
	for i < len(p.demand) && p.demand[i].Before(cut) {
		i++
	}
	p.demand = p.demand[i:]
	rate := float64(len(p.demand)) / 30
	want := p.base + int(math.Round(2*rate*p.boot.Seconds()))
	p.target.Store(int64(min(max(want, p.base), p.max)))
}

// fill keeps the pool at its target until ctx ends, booting one sandbox
// at a time (boots are CPU-heavy; creates that find the pool empty go
// cold meanwhile).
func (p *pool) fill(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	failures := 0
	var over time.Time // since when the pool holds more than its target
	for ctx.Err() == nil {
		if p.purgeDead.Swap(false) {
			p.purge()
		}
		p.adapt()
		// A shrink leaves the pool at or above its target: no refill
		// follows, and the next shrink waits for the next round.
		p.shrink(&over)
		if int64(len(p.ready)) < p.target.Load() {
			start := time.Now()
			// A boot is never cut short (killing runsc mid-start can
			// orphan its sandbox process): it runs to the end, and a
			// pool that stopped meanwhile discards the result.
			// Pool boots run at the lowest CPU share, so on a saturated
			// host they can take minutes: the deadline is generous.
			// Booting is the heaviest work there is: not while a burst of
			// creates is being answered and, while the pool still has a
			// sandbox to hand out, not while sandboxes are being used (a
			// create is mostly followed at once by a command, which a boot
			// on the other core slowed down by ~40 ms here).
			quiet := time.Duration(0)
			if len(p.ready) > 0 {
				quiet = refillQuiet
			}
			p.s.afterBurst(ctx.Done(), refillMaxDefer, quiet)
			if ctx.Err() != nil {
				return // stopped while waiting: no boot to throw away
			}
			if err := p.s.hostHasRoom(); err != nil {
				// Below the host's memory reserve: creates are refused,
				// and a boot would only take more.
				if !p.starved {
					p.s.log.Warn("warm pool: not refilling", "err", err)
					p.starved = true
				}
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				continue
			}
			p.starved = false
			bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
			w, err := p.refill(bctx)
			if err == nil && p.prestart != nil {
				result := p.s.prestart(bctx, p.prestart, w)
				if p.s.metrics != nil {
					p.s.metrics.PoolPrestarts.WithLabelValues(p.tpl.Name, result).Inc()
				}
			}
			bcancel()
			if err == nil && ctx.Err() != nil {
				p.s.discardWarm(w)
				return
			}
			if err != nil {
				failures++
				p.s.log.Warn("warm pool: boot failed", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(min(failures, 10)) * time.Second):
				}
				continue
			}
			failures = 0
			p.mu.Lock()
			p.boot = time.Since(start)
			p.mu.Unlock()
			if int64(len(p.ready)) >= p.target.Load() {
				// Shrunk while it booted (SetPool).
				p.s.discardWarm(w)
				continue
			}
			p.s.prewatch(w)
			p.watchWarm(w)
			select {
			case p.ready <- w:
				continue
			default:
				p.s.discardWarm(w)
			}
		}
		select {
		case <-ctx.Done():
		case <-p.kick:
		case <-t.C:
		}
	}
}

// shrink gives back what a burst grew: once the pool has held more warm
// sandboxes than its target for poolShrinkAfter, it destroys the one
// waiting longest, one per call (fill calls it once a round, a second
// apart when nothing else wakes it). over is when the pool went above its
// target (zero while it is not).
func (p *pool) shrink(over *time.Time) {
	target := p.target.Load()
	if int64(len(p.ready)) <= target {
		*over = time.Time{}
		return
	}
	now := time.Now()
	if over.IsZero() {
		*over = now
	}
	if now.Sub(*over) < poolShrinkAfter {
		return
	}
	select {
	case w := <-p.ready:
		p.s.discardWarm(w)
		if p.s.metrics != nil {
			p.s.metrics.PoolShrinks.WithLabelValues(p.shape.driver).Inc()
		}
		p.s.log.Info("warm pool shrank: its create rate fell", "template", p.tpl.Name, "driver", p.shape.driver, "destroyed", w.sb.ID, "ready", len(p.ready), "target", target)
	default: // claimed meanwhile
	}
}

// bootWarm starts one pooled sandbox: recorded as pooled (so a server
// crash cleans it up on restart), booted, agent answering, warmed up (the
// agent runs a program and a login shell once and forgets them, so the
// first command after a claim does not pay for cold caches).
func (s *Service) bootWarm(ctx context.Context, p *pool) (*warm, error) {
	sb := s.pooledRecord(p)
	if err := s.store.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	inst, agent, _, err := s.boot(ctx, sb, p.tpl, true)
	if err != nil {
		s.dropFailed(context.WithoutCancel(ctx), sb.ID, []string{StatePooled}, err)
		return nil, err
	}
	sb.Handle, _ = json.Marshal(inst.Handle())
	// Best effort: a sandbox that cannot warm up is still a good one.
	wctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	if err := agent.Warmup(wctx); err != nil {
		s.log.Debug("warm pool: warm-up failed", "sandbox", sb.ID, "err", err)
	}
	cancel()
	return &warm{sb: sb, inst: inst, agent: agent}, nil
}

// prewatch registers a warm sandbox's memory watch (driver.MemoryWatcher)
// now, while it waits in the pool, rather than when it is claimed. A
// cgroup v1 threshold registration blocks in the kernel for an RCU grace
// period, and its goroutine keeps one of the server's two scheduler Ps
// meanwhile, until sysmon takes it back: up to 10 ms on a server that had
// been idle. Done at claim time, twenty at once, it stalled the rest of a
// burst of creates (p90 22-33 ms against 7-13 without it, 10 rounds of 20
// concurrent warm creates). The watch outlives the claim: the claimed
// sandbox's watch goroutine ends it with the instance. A sandbox whose
// registration fails is claimed as well; watch then tries again.
func (s *Service) prewatch(w *warm) {
	mw, ok := w.inst.(driver.MemoryWatcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	id, agent := w.sb.ID, w.agent
	if err := mw.WatchMemory(ctx, func() int64 { return s.reclaimMemory(id, agent) }); err != nil {
		cancel()
		s.log.Debug("warm pool: memory watch not registered; the claim registers it", "sandbox", id, "err", err)
		return
	}
	w.stopMemWatch = cancel
}

// discardWarm destroys a pooled sandbox that will not be used.
func (s *Service) discardWarm(w *warm) {
	ctx := context.Background()
	if w.stopWait != nil {
		w.stopWait()
	}
	if w.stopMemWatch != nil {
		w.stopMemWatch()
	}
	w.agent.Close()
	if err := w.inst.Destroy(ctx); err != nil {
		// Its record (with the handle) stays: the next start's Recover
		// destroys pooled sandboxes again. Deleted, nothing would know of
		// the instance that may still run.
		s.log.Error("warm pool: destroying a warm sandbox failed; its record stays for the next start", "sandbox", w.sb.ID, "err", err)
		return
	}
	_ = s.store.DeleteSandbox(ctx, w.sb.ID)
}

// confirmWithin bounds confirmIdentity's asking (a variable for tests).
var confirmWithin = time.Minute

// How background work caused by creates yields to a burst of them: it
// waits until no create has been in flight for burstGap, at most the
// given bound (so a steady stream of creates cannot starve it).
const (
	burstGap  = 10 * time.Millisecond
	burstPoll = 2 * time.Millisecond
)

// warmupTimeout bounds a pooled sandbox's warm-up (at the lowest CPU share
// on a busy host it can take a while; it is skipped, not retried).
const warmupTimeout = 10 * time.Second

var (
	identityMaxDefer = 250 * time.Millisecond // a var for tests
	refillMaxDefer   = time.Second
	// refillQuiet is how long no request must have reached a sandbox
	// before a refill that is not urgent (the pool is not empty) boots.
	refillQuiet = 150 * time.Millisecond
	// poolShrinkAfter is how long a pool holds more warm sandboxes than
	// its target (its create rate fell) before it destroys the extra ones,
	// one a second: a lull shorter than this keeps them for the next burst.
	poolShrinkAfter = time.Minute
)

// afterBurst returns once no create is in flight and none ended in the
// last burstGap, and (quiet > 0) no request reached a sandbox in the last
// quiet; after at most limit, or when wake is closed.
func (s *Service) afterBurst(wake <-chan struct{}, limit, quiet time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		now := time.Now()
		wait := burstGap - now.Sub(time.Unix(0, s.lastCreate.Load()))
		if s.creating.Load() > 0 {
			wait = max(wait, burstPoll)
		}
		if quiet > 0 {
			wait = max(wait, quiet-now.Sub(time.Unix(0, s.lastUse.Load())))
		}
		if wait <= 0 || !now.Before(deadline) {
			return
		}
		t := time.NewTimer(min(wait, deadline.Sub(now)))
		select {
		case <-wake:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// StopPools stops refilling and destroys every warm sandbox.
// No pool starts, changes or retires after it began, so once it returned
// no warm sandbox is left running.
func (s *Service) StopPools() {
	s.poolsMu.Lock()
	s.poolsStopped = true
	ps := s.pools
	s.poolsMu.Unlock()
	if ps == nil {
		return
	}
	ps.mu.Lock()
	ps.closed = true
	ps.mu.Unlock()
	ps.cancel()
	ps.wg.Wait()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := 0
	for k, p := range ps.byKey {
		n += s.drainPool(p)
		delete(ps.byKey, k)
	}
	// Whatever else is there (a temp dir of a build cut short).
	_ = os.RemoveAll(s.poolImagesDir())
	s.log.Info("warm pools drained", "destroyed", n)
}

// retirePool stops a pool that was replaced (its template was rebuilt, or
// SetPool gave it another shape) or stopped, and destroys its warm sandboxes, after
// its refill in flight (never cut short) ended.
func (s *Service) retirePool(p *pool) {
	p.cancel()
	<-p.done
	n := s.drainPool(p)
	s.log.Info("warm pool retired", "template", p.tpl.Name, "digest", p.tpl.Digest[:min(12, len(p.tpl.Digest))], "driver", p.shape.driver,
		"cpu", p.shape.cpu, "memory_mb", p.shape.memoryMB, "destroyed", n)
}

// drainPool destroys a stopped pool's warm sandboxes and its image,
// returning how many sandboxes it destroyed.
func (s *Service) drainPool(p *pool) int {
	if p.img != nil {
		s.removePoolImage(p, p.img)
	}
	n := 0
	for {
		select {
		case w := <-p.ready:
			s.discardWarm(w)
			n++
		default:
			return n
		}
	}
}

// PoolStatus is one warm pool as an operator sees it.
type PoolStatus struct {
	Template  string `json:"template"`
	Digest    string `json:"digest"`
	Driver    string `json:"driver"`
	CPU       int    `json:"cpu"`
	MemoryMB  int    `json:"memory_mb"`
	Size      int    `json:"size"`       // the base size it keeps
	Max       int    `json:"max"`        // the most its target grows to
	Target    int    `json:"target"`     // what it refills to now (size plus the create rate's share)
	Ready     int    `json:"ready"`      // warm sandboxes waiting for a create
	FromImage bool   `json:"from_image"` // refills by restoring a post-boot checkpoint
	// Prestart is the command each of its sandboxes runs before it joins
	// the pool (PoolConfig.Prestart), absent when none.
	Prestart []string `json:"prestart,omitempty"`
	// Source is where its size came from: "flags" (the server's command
	// line) or "api" (PUT /v1/pools/{template}, kept across restarts).
	Source string `json:"source,omitempty"`
	// State is "running" for every pool Pools reports; the API adds the
	// configured pools that do not run: "waiting_for_template" (it starts
	// once its template is built here) and "off" (a setting of size 0).
	State string `json:"state"`
}

// Pools reports the running warm pools, by template, driver, CPUs and
// memory.
func (s *Service) Pools() []PoolStatus {
	out := []PoolStatus{}
	ps := s.poolSet()
	if ps == nil {
		return out
	}
	ps.mu.Lock()
	for k, p := range ps.byKey {
		p.mu.Lock()
		st := PoolStatus{
			Template: p.tpl.Name, Digest: k.digest, Driver: k.driver, CPU: k.cpu, MemoryMB: k.memoryMB,
			Size: p.base, Max: p.max, Target: int(p.target.Load()), Ready: len(p.ready), FromImage: p.img != nil,
			Source: p.source, State: "running",
		}
		p.mu.Unlock()
		if p.prestart != nil {
			st.Prestart = slices.Clone(p.prestart.Start.Cmd)
		}
		out = append(out, st)
	}
	ps.mu.Unlock()
	slices.SortFunc(out, func(a, b PoolStatus) int {
		return cmp.Or(cmp.Compare(a.Template, b.Template), cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.CPU, b.CPU), cmp.Compare(a.MemoryMB, b.MemoryMB))
	})
	return out
}

// PoolReady reports how many warm sandboxes are ready, per template name.
func (s *Service) PoolReady() map[string]int {
	out := map[string]int{}
	for _, p := range s.Pools() {
		out[p.Template] += p.Ready
	}
	return out
}

// poolTeam owns pooled sandboxes until a claim: no API key can have it
// (team names start with a letter or digit).
const poolTeam = "_pool"

// poolDiskMB is the disk of pooled sandboxes: a create's default.
func (s *Service) poolDiskMB() int { return min(DefaultDiskMB, s.cfg.MaxDiskMB) }
