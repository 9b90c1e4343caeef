// Package server is the composition root of `space serve`: it opens the
// store, bootstraps the admin key, builds the driver, template registry and
// sandbox service, recovers sandboxes left by an earlier process, serves the
// HTTP API and shuts down in order.
package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/spacesandbox/space/api"
	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/firecracker"
	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/driver/qemu"
	"github.com/spacesandbox/space/internal/e2b"
	"github.com/spacesandbox/space/internal/filelock"
	"github.com/spacesandbox/space/internal/httpapi"
	spacemcp "github.com/spacesandbox/space/internal/mcp"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/security"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
	"github.com/spacesandbox/space/internal/vmimage"
)

// Run serves until ctx is cancelled. Sandboxes keep running after Run
// returns; the next Run on the same data dir re-attaches them.
func Run(ctx context.Context, cfg Config) error {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(cfg)
	slog.SetDefault(log)
	driverPools, err := ParsePoolDrivers(cfg.PoolDrivers)
	if err != nil {
		return err
	}
	templatePools, err := ParsePools(cfg.Pools)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// One server per data dir, before anything in it is touched: a second
	// one ran the store's migrations under the first and its driver's
	// start-up cleanup removed the first's agent copies mid-create. A
	// server that is still shutting down gets a few seconds.
	lctx, lcancel := context.WithTimeout(ctx, dataDirLockWait)
	unlock, err := filelock.Lock(lctx, filepath.Join(cfg.DataDir, LockFile))
	lcancel()
	if err != nil {
		return fmt.Errorf("data dir %s is in use by another space server: %w", cfg.DataDir, err)
	}
	defer unlock()
	database := cfg.Database
	if database == "" {
		database = filepath.Join(cfg.DataDir, "space.db")
	}
	st, err := store.OpenDatabase(ctx, database)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	// Sandboxes run in this process, and recovery below takes every live
	// record as this server's: one such server per database.
	releaseHost, err := st.HoldSandboxHost(ctx)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer releaseHost()
	keyPath, err := bootstrapKey(ctx, st, cfg.DataDir, log)
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	log.Info("admin API key", "file", keyPath)

	if cfg.RunscPath == "" {
		cfg.RunscPath = filepath.Join(cfg.CacheDir, "runsc-"+gvisor.BuildName(), "runsc")
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return fmt.Errorf("space-agent binary not found at %s (build it with `make build`, or pass --agent): %w", cfg.AgentPath, err)
	}
	enabled := cfg.Drivers
	if enabled == "" {
		enabled = cfg.Driver
	}
	var drivers []driver.Driver
	names := map[string]bool{}
	for _, name := range strings.Split(enabled, ",") {
		name = strings.TrimSpace(name)
		names[name] = true
		switch name {
		case gvisor.Name:
			d, err := gvisor.New(ctx, gvisor.Config{Runsc: cfg.RunscPath, Root: filepath.Join(cfg.DataDir, "runsc"), Log: log})
			if err != nil {
				return fmt.Errorf("%w (build runsc with `make runsc`, or pass --runsc)", err)
			}
			drivers = append(drivers, d)
		case qemu.Name:
			d, err := qemu.New(ctx, qemu.Config{CacheDir: filepath.Join(cfg.CacheDir, "vm"), NoCgroups: cfg.QEMUCgroups == "off", Log: log})
			if err != nil {
				return err
			}
			log.Info("qemu driver ready", "accelerator", d.Accel())
			drivers = append(drivers, d)
		case firecracker.Name:
			jailer, noJailer := cfg.JailerPath, cfg.JailerPath == "none"
			if noJailer {
				jailer = ""
			}
			d, err := firecracker.New(ctx, firecracker.Config{
				Firecracker: cfg.FirecrackerPath, Jailer: jailer, NoJailer: noJailer,
				UID: cfg.FirecrackerUID, GID: cfg.FirecrackerUID,
				CacheDir: filepath.Join(cfg.CacheDir, "vm"), Log: log,
			})
			if err != nil {
				return err
			}
			log.Info("firecracker driver ready", "version", d.Version())
			drivers = append(drivers, d)
		default:
			return fmt.Errorf("driver %q is not available (available: gvisor, qemu, firecracker)", name)
		}
	}
	if !names[cfg.Driver] {
		return fmt.Errorf("--driver %s is not among --drivers %s", cfg.Driver, enabled)
	}
	pools, err := poolConfigs(cfg, driverPools, templatePools)
	if err != nil {
		return err
	}
	for _, p := range pools {
		if !names[p.Driver] {
			return fmt.Errorf("warm pool of %s on %s: driver %s is not among --drivers %s", p.Template, p.Driver, p.Driver, enabled)
		}
	}
	vmCache := filepath.Join(cfg.CacheDir, "vm")
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := sandbox.NewMetrics(reg, st.CountSandboxesByState)
	var tpls *templates // set before anything is served
	svc := sandbox.New(sandbox.Config{
		AwaitTemplate: func(ctx context.Context, name string) (bool, error) { return tpls.Await(ctx, name) },
		DataDir:       cfg.DataDir, AgentPath: cfg.AgentPath,
		DefaultDriver: cfg.Driver, DefaultTemplate: cfg.DefaultTemplate,
		DefaultTimeout:  time.Duration(cfg.DefaultTimeoutS) * time.Second,
		MaxTimeout:      time.Duration(cfg.MaxTimeoutS) * time.Second,
		TeamQuota:       store.Quota{MaxSandboxes: cfg.TeamMaxSandboxes, MaxMemoryMB: cfg.TeamMaxMemoryMB, MaxCPU: cfg.TeamMaxCPU, MaxSnapshotMB: cfg.TeamMaxSnapshotMB, MaxRPS: cfg.TeamMaxRPS, MaxDiskMB: cfg.TeamMaxDiskMB},
		ReserveMemoryMB: reserveMB(cfg.ReserveMemoryMB, sandbox.DefaultReserveMB),
		ReserveDiskMB:   reserveMB(cfg.ReserveDiskMB, func() int { return sandbox.DefaultReserveDiskMB(cfg.DataDir) }),
		// Each driver gets the template in the form it boots: the
		// directory for gVisor, a raw ext4 image (built once per template
		// digest) for VMs.
		Rootfs: func(ctx context.Context, drv string, tpl store.Template) (string, string, error) {
			if drv == qemu.Name || drv == firecracker.Name {
				img, err := vmimage.RootImage(ctx, vmCache, tpl.Path, tpl.Digest)
				return img, "raw", err
			}
			return tpl.Path, tpl.Kind, nil
		},
	}, st, drivers, log, metrics)
	sandbox.RegisterPoolReady(reg, svc.PoolReady)
	poolMgr, err := newPoolManager(ctx, svc, st, log, names, cfg.Driver, cfg.E2BListen != "", pools)
	if err != nil {
		return err
	}
	snaps, err := snapshot.New(filepath.Join(cfg.DataDir, "snapshots"))
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	defer snaps.Close()
	interval := time.Duration(cfg.SnapshotIntervalS) * time.Second
	retain := time.Duration(cfg.RetentionDays) * 24 * time.Hour
	svc.SetSnapshots(sandbox.Snapshots{
		Store: snaps, Interval: interval, CheckpointOnPause: cfg.CheckpointOnPause != "off", OnExec: cfg.SnapshotOnExec == "on",
		Retention: snapshot.Policy{KeepAll: time.Hour, Hourly: 24 * time.Hour, Daily: retain, NamedMaxAge: retain},
	})
	eg, err := newEgress(cfg, log)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	reg.MustRegister(eg.Proxy.Collectors()...)
	svc.SetEgress(eg)
	if err := svc.Recover(ctx); err != nil {
		svc.Shutdown() // its background retries end with it
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	defer svc.Shutdown()
	// Sandboxes whose runsc or VMM was killed without its cleanup (a
	// server or a host that died mid-destroy) leave empty cgroups under
	// space/: every hierarchy keeps them until removed.
	if ids := cgroup.RemoveOrphans(orphanCgroupAge, func(id string) bool { return strings.HasPrefix(id, "sb-") }); len(ids) > 0 {
		log.Info("removed orphaned sandbox cgroups", "count", len(ids), "sandboxes", strings.Join(ids, ","))
	}

	builder, err := template.NewBuilder(filepath.Join(cfg.CacheDir, "templates"))
	if err != nil {
		return fmt.Errorf("template cache: %w", err)
	}
	tpls = &templates{store: st, builder: builder, log: log, ready: poolMgr.templateReady, failed: poolMgr.templateFailed}
	health := &health{detail: "default template " + cfg.DefaultTemplate + " not ready yet"}

	var apiGatherer prometheus.Gatherer = reg // /metrics on the API listener unless it has its own
	if cfg.MetricsListen != "" {
		apiGatherer = nil
	}
	api := httpapi.New(httpapi.Config{
		Service: svc, Store: st, Templates: tpls, Pools: poolMgr, Health: health.get,
		OpenAPI: api.OpenAPI, Gatherer: apiGatherer, Log: log,
		Security: security.NewLocal(cfg.DataDir, log),
	})
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Requests end when the grace period after a shutdown signal does (a
	// template build an admin started, a long exec stream).
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	// /mcp: the MCP tools, each call run through the API above in
	// process with the request's own key (internal/mcp).
	root := http.NewServeMux()
	root.Handle("/mcp", spacemcp.Handler(api, api.RequireKey, "", log))
	root.Handle("/", api)
	srv := NewHTTPServer(root)
	srv.BaseContext = func(net.Listener) context.Context { return reqCtx }
	url := "http://" + ln.Addr().String()
	if err := writeServeFile(cfg.DataDir, url); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(cfg.DataDir, ServeFile))
	log.Info("serving", "url", url, "driver", cfg.Driver, "data", cfg.DataDir, "store", st.Backend())

	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(ctx)
	// Every return waits for the background work it started (a listener
	// that fails to open returned with History and Reap still running
	// into the store's close).
	defer wg.Wait()
	defer stopBG()
	wg.Add(3)
	go func() {
		defer wg.Done()
		tick := 30 * time.Second
		if interval > 0 && interval/4 < tick {
			tick = max(interval/4, time.Second)
		}
		svc.History(bg, tick)
	}()
	// The templates built at start are counted before anything is
	// served: a create of one waits for its build (sandbox.Config's
	// AwaitTemplate). With the E2B API on, the code interpreter's
	// template (code-interpreter-v1, what @e2b/code-interpreter creates)
	// is built after the default one, which it builds on.
	tpls.expect(cfg.DefaultTemplate)
	interp := cfg.E2BListen != "" && e2b.InterpreterTemplate != cfg.DefaultTemplate
	if interp {
		tpls.expect(e2b.InterpreterTemplate)
	}
	defaultTried := make(chan struct{}) // the default template's first build attempt ended
	go func() {
		defer wg.Done()
		health.ensureTemplate(bg, tpls, cfg.DefaultTemplate, log, func() {
			tpls.settle(cfg.DefaultTemplate)
			close(defaultTried)
		})
	}()
	if interp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-defaultTried:
			case <-bg.Done():
			}
			log.Info("building the E2B code interpreter's template", "template", e2b.InterpreterTemplate, "e2b_template", "code-interpreter-v1")
			tpls.ensure(bg, e2b.InterpreterTemplate, "E2B code interpreter template", log, nil, func() { tpls.settle(e2b.InterpreterTemplate) })
		}()
	}

	// Warm pools start when their template is ready: the default one once
	// ensureTemplate built it, others at once when this data dir has them,
	// else when an admin builds them (POST /v1/templates/{name}/build),
	// and again (on its new digest) when one is rebuilt. An admin's pool
	// setting (PUT /v1/pools/{template}) replaces the command line's.
	for _, name := range poolMgr.templates() {
		if name == cfg.DefaultTemplate {
			continue
		}
		if tpl, err := st.GetTemplate(ctx, name); err == nil && tpl.Status == store.TemplateReady {
			tpls.ready(tpl)
		} else {
			log.Warn("warm pool waits for its template: build it to start the pool", "template", name, "build", "space template build "+name)
		}
	}
	go func() {
		defer wg.Done()
		svc.Reap(bg, time.Second)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		pruneTemplates(bg, st, builder, vmCache, log)
	}()

	if cfg.DebugListen != "" {
		if err := serveDebug(bg, cfg.DebugListen, log); err != nil {
			return err
		}
	}
	if cfg.MetricsListen != "" {
		if err := serveMetrics(bg, cfg.MetricsListen, reg, log); err != nil {
			return err
		}
	}
	if cfg.E2BListen != "" { // E2B-compatible API (internal/e2b), stops with bg
		wait, err := e2b.Serve(bg, cfg.E2BListen, e2b.Config{Service: svc, Store: st, DataDir: cfg.DataDir, Domain: cfg.E2BDomain, Log: log})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); wait() }()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	}
	log.Info("shutting down")
	stopBG()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("requests still running after the grace period are cut", "grace", shutdownGrace)
		cancelRequests()
		_ = srv.Close()
	}
	return nil
}

// dataDirLockWait is how long a server waits for another one to leave its
// data dir (one shutting down).
var dataDirLockWait = 10 * time.Second

// shutdownGrace is how long requests in flight get after a shutdown signal.
const shutdownGrace = 5 * time.Second

// NewHTTPServer is the http.Server of every listener the server opens:
// bounded header reads, and idle keep-alive connections closed after two
// minutes (without IdleTimeout and ReadTimeout Go waits for a
// connection's next request for good: anyone could hold file descriptors
// open with one request each).
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

func newLogger(cfg Config) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// bootstrapKey makes sure the data dir has an admin key file whose hash is
// in the store, creating both on first start. A file whose key is not in
// the store was either revoked (deleted through the API: other admin keys
// exist, as the last one cannot be deleted) and is replaced by a new key,
// never revived, or belongs to a store that has no admin key at all (the
// database was reset) and is added back.
func bootstrapKey(ctx context.Context, st *store.Store, dataDir string, log *slog.Logger) (string, error) {
	path := filepath.Join(dataDir, KeyFile)
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return path, err
	}
	add := func(key string) error {
		return st.CreateKey(ctx, store.Key{ID: httpapi.NewKeyID(), Hash: httpapi.HashKey(key), Team: "admin", Admin: true, Name: "bootstrap", CreatedAt: time.Now().UTC()})
	}
	if err == nil {
		key := strings.TrimSpace(string(b))
		if _, err := st.KeyByHash(ctx, httpapi.HashKey(key)); err == nil {
			return path, nil
		}
		keys, err := st.ListKeys(ctx, "")
		if err != nil {
			return path, err
		}
		if !slices.ContainsFunc(keys, func(k store.Key) bool { return k.Admin }) {
			return path, add(key)
		}
		log.Warn("the admin key in the key file was deleted through the API; writing a new one there (the old key stays revoked)", "file", path)
	}
	key := httpapi.NewKey()
	if err := add(key); err != nil {
		return path, err
	}
	return path, writeFileAtomic(path, []byte(key+"\n"), 0o600)
}

func writeServeFile(dataDir, url string) error {
	b, _ := json.Marshal(map[string]string{"url": url})
	return writeFileAtomic(filepath.Join(dataDir, ServeFile), b, 0o644)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// health is what /healthz reports.
type health struct {
	mu     sync.Mutex
	ready  bool
	detail string
}

func (h *health) get() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready, h.detail
}

func (h *health) set(ready bool, detail string) {
	h.mu.Lock()
	h.ready, h.detail = ready, detail
	h.mu.Unlock()
}

// ensureTemplate builds the default template if this data dir lacks it
// (a cache hit when another data dir on the host built the same recipe),
// logging progress, and marks the server healthy when it is ready, or
// at once when an earlier build of it serves creates while a new recipe
// builds. /healthz needs no key, so it says only how far the build is:
// its output and errors (host paths, the mirror) go to the log.
func (h *health) ensureTemplate(ctx context.Context, t *templates, name string, log *slog.Logger, firstDone func()) {
	t.ensure(ctx, name, "default template", log, h.set, firstDone)
}

// ensure builds template name until it serves or ctx ends, logging its
// progress (what names it in the log), retrying a failed build with a
// growing pause; state, when set, follows it. firstDone, when set, is
// called once the first attempt ended (or ctx did before it): a caller
// that counted the build with t.expect, so that creates wait for it from
// before it starts, settles it there (a create then sees the template
// ready, or failed until the next attempt).
func (t *templates) ensure(ctx context.Context, name, what string, log *slog.Logger, state func(ready bool, detail string), firstDone func()) {
	if state == nil {
		state = func(bool, string) {}
	}
	if firstDone == nil {
		firstDone = func() {}
	}
	settle := sync.OnceFunc(firstDone)
	defer settle()
	for attempt := 1; ctx.Err() == nil; attempt++ {
		if _, serving := t.serving(ctx, name); serving {
			state(true, "")
		} else {
			state(false, "template "+name+": building")
		}
		_, err := t.Build(ctx, name, func(line string) {
			log.Info("template build", "template", name, "line", line)
		})
		settle()
		if err == nil {
			state(true, "")
			log.Info(what+" ready", "template", name)
			return
		}
		if _, serving := t.serving(ctx, name); !serving {
			state(false, "template "+name+": build failed, retrying")
		}
		log.Error(what+" build failed; retrying", "template", name, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(min(attempt, 6)) * 10 * time.Second):
		}
	}
}

// poolConfigs are the warm pools to keep: --pool-size of the default
// template on the default driver, then every --pool-drivers entry (the
// default template on that driver), then every --pools entry, each
// replacing what came before for its template and driver (a size of 0
// removes it). Errors: a --pools template and driver given twice (once
// with the default driver named, once without).
func poolConfigs(cfg Config, driverPools, templatePools []PoolSpec) ([]sandbox.PoolConfig, error) {
	type key struct{ template, driver string }
	var order []key
	byKey := map[key]PoolSpec{}
	set := func(p PoolSpec) key {
		p.Template = cmp.Or(p.Template, cfg.DefaultTemplate)
		p.Driver = cmp.Or(p.Driver, cfg.Driver)
		k := key{p.Template, p.Driver}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = p
		return k
	}
	if cfg.PoolSize > 0 {
		set(PoolSpec{Size: cfg.PoolSize})
	}
	for _, p := range driverPools {
		set(p)
	}
	seen := map[key]bool{}
	for _, p := range templatePools {
		k := set(p)
		if seen[k] {
			return nil, fmt.Errorf("--pools: template %s on driver %s given twice", k.template, k.driver)
		}
		seen[k] = true
	}
	var out []sandbox.PoolConfig
	for _, k := range order {
		if p := byKey[k]; p.Size > 0 {
			out = append(out, sandbox.PoolConfig{Template: p.Template, Size: p.Size, Driver: p.Driver, MemoryMB: p.MemoryMB, CPU: p.CPU, FromImage: refillsFromImage(p.Driver)})
		}
	}
	return out, nil
}

// refillsFromImage says whether a driver's pools refill by restoring a
// post-boot checkpoint instead of booting: only where a restore is faster
// than a boot. QEMU: yes (TCG here: restore ~2.5 s, boot ~4.5 s).
// gVisor: no (a restore is not faster than its ~0.5 s boot). Firecracker:
// would pay (snapshot loads take milliseconds) but is untested on a host
// without KVM, so it stays off.
func refillsFromImage(drv string) bool { return drv == qemu.Name }

// orphanCgroupAge is how old an empty sandbox cgroup must be to be taken
// for an orphan at start: a create places its process right after making
// the cgroup, and another server on the host may be creating one now.
const orphanCgroupAge = 10 * time.Minute

// reserveMB resolves a --reserve-*-mb flag: 0 is the default (def), -1 off.
func reserveMB(flag int, def func() int) int {
	switch {
	case flag == 0:
		return def()
	case flag < 0:
		return 0
	}
	return flag
}
