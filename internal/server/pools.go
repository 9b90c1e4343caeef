package server

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/e2b"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpapi"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
)

// poolKey names a warm pool as flags and settings do: one per template
// and driver (the driver resolved).
type poolKey struct{ template, driver string }

// poolManager keeps the warm pools that the command line and an admin's
// settings (PUT /v1/pools/{template}, stored, so they outlive restarts)
// ask for. A setting replaces the command line's pool of its template and
// driver; deleting it brings that pool back (or none). A pool runs once
// its template is built.
type poolManager struct {
	svc           *sandbox.Service
	store         *store.Store
	log           *slog.Logger
	drivers       map[string]bool // enabled
	defaultDriver string
	e2b           bool // the E2B API is on: python-data pools prestart its kernel
	ctx           context.Context

	mu    sync.Mutex // serialises changes and their application
	flags map[poolKey]sandbox.PoolConfig
	set   map[poolKey]store.PoolSetting
}

func newPoolManager(ctx context.Context, svc *sandbox.Service, st *store.Store, log *slog.Logger, drivers map[string]bool, defaultDriver string, e2bOn bool, flags []sandbox.PoolConfig) (*poolManager, error) {
	m := &poolManager{
		svc: svc, store: st, log: log, drivers: drivers, defaultDriver: defaultDriver, e2b: e2bOn, ctx: ctx,
		flags: map[poolKey]sandbox.PoolConfig{}, set: map[poolKey]store.PoolSetting{},
	}
	for _, p := range flags {
		m.flags[poolKey{p.Template, p.Driver}] = p
	}
	settings, err := st.PoolSettings(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range settings {
		// A setting the server can no longer apply (its driver was
		// taken off --drivers, its template is no longer built in) stays
		// stored, for when it can again, and is said once.
		if _, err := template.Builtin(p.Template); err != nil {
			log.Warn("warm pool setting ignored: no such template", "template", p.Template, "driver", p.Driver)
			continue
		}
		if !drivers[p.Driver] {
			log.Warn("warm pool setting ignored: its driver is not among --drivers", "template", p.Template, "driver", p.Driver)
			continue
		}
		m.set[poolKey{p.Template, p.Driver}] = p
	}
	return m, nil
}

// config is the pool that applies to k now (Size 0: none), with where it
// came from.
func (m *poolManager) config(k poolKey) sandbox.PoolConfig {
	if p, ok := m.set[k]; ok {
		cfg := m.complete(sandbox.PoolConfig{Template: k.template, Driver: k.driver, Size: p.Size, Max: p.Max, MemoryMB: p.MemoryMB, CPU: p.CPU, Source: "api"})
		if p.NoPrestart {
			cfg.Prestart = nil
		}
		return cfg
	}
	if p, ok := m.flags[k]; ok {
		p.Source = "flags"
		return m.complete(p)
	}
	return sandbox.PoolConfig{Template: k.template, Driver: k.driver}
}

// complete adds what follows from the template and driver: refills by
// restore, the code interpreter's prestarted kernel.
func (m *poolManager) complete(p sandbox.PoolConfig) sandbox.PoolConfig {
	p.FromImage = refillsFromImage(p.Driver)
	if m.e2b && p.Template == e2b.InterpreterTemplate {
		// The code interpreter's default kernel is running, its libraries
		// loaded, in every sandbox of its template's pools.
		p.Prestart = e2b.KernelPrestart()
	}
	return p
}

// keys lists every pool key that flags or settings name, sorted.
func (m *poolManager) keys() []poolKey {
	var out []poolKey
	for k := range m.flags {
		out = append(out, k)
	}
	for k := range m.set {
		if _, ok := m.flags[k]; !ok {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b poolKey) int {
		return cmp.Or(cmp.Compare(a.template, b.template), cmp.Compare(a.driver, b.driver))
	})
	return out
}

// templates lists the templates some pool applies to, once each.
func (m *poolManager) templates() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, k := range m.keys() {
		if m.config(k).Size > 0 && !slices.Contains(out, k.template) {
			out = append(out, k.template)
		}
	}
	return out
}

// templateReady starts (or, on a new build, replaces) the pools of a
// template that is ready.
func (m *poolManager) templateReady(tpl store.Template) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range m.keys() {
		if k.template != tpl.Name {
			continue
		}
		if cfg := m.config(k); cfg.Size > 0 {
			if err := m.svc.SetPool(m.ctx, tpl, cfg); err != nil {
				m.log.Error("warm pool not started", "template", tpl.Name, "driver", k.driver, "err", err)
			}
		}
	}
}

// templateFailed stops the pools of a template whose build failed: the
// template's record is failed, creates refuse it, and warm sandboxes of
// its earlier build would wait for a claim that never comes. They start
// again with the next good build (templateReady).
func (m *poolManager) templateFailed(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range m.keys() {
		if k.template == name {
			m.svc.StopPool(k.template, k.driver)
		}
	}
}

// apply makes the running pool of k what config says (m.mu held).
func (m *poolManager) apply(ctx context.Context, k poolKey) (state string, err error) {
	cfg := m.config(k)
	if cfg.Size == 0 {
		m.svc.StopPool(k.template, k.driver)
		return "off", nil
	}
	tpl, err := m.store.GetTemplate(ctx, k.template)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && tpl.Status != store.TemplateReady) {
		return "waiting_for_template", nil
	}
	if err != nil {
		return "", err
	}
	if err := m.svc.SetPool(m.ctx, tpl, cfg); err != nil {
		return "", err
	}
	return "running", nil
}

// key checks a template and driver named by a request and resolves the
// driver: one enabled on this server, or with anyDriver (a delete) any
// known one, so that a setting left by a driver taken off --drivers can be
// deleted.
func (m *poolManager) key(template_, drv string, anyDriver bool) (poolKey, error) {
	if _, err := template.Builtin(template_); err != nil {
		return poolKey{}, err
	}
	drv = cmp.Or(drv, m.defaultDriver)
	if !m.drivers[drv] && !(anyDriver && knownDrivers[drv]) {
		return poolKey{}, errdefs.InvalidArgument("driver %q is not enabled on this server", drv)
	}
	return poolKey{template_, drv}, nil
}

// SetPool stores an admin's pool and applies it at once.
func (m *poolManager) SetPool(ctx context.Context, req httpapi.PoolSetting) (httpapi.PoolSetting, error) {
	k, err := m.key(req.Template, req.Driver, false)
	if err != nil {
		return httpapi.PoolSetting{}, err
	}
	cfg, err := m.svc.CheckPool(sandbox.PoolConfig{Template: k.template, Driver: k.driver, Size: req.Size, Max: req.Max, MemoryMB: req.MemoryMB, CPU: req.CPU})
	if err != nil {
		return httpapi.PoolSetting{}, err
	}
	if req.Prestart != nil && *req.Prestart && m.complete(cfg).Prestart == nil {
		return httpapi.PoolSetting{}, errdefs.InvalidArgument("prestart: pools of %s start no process (only python-data's, with the E2B API on)", k.template)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := store.PoolSetting{
		Template: k.template, Driver: k.driver, Size: cfg.Size, Max: cfg.Max, MemoryMB: cfg.MemoryMB, CPU: cfg.CPU,
		NoPrestart: req.Prestart != nil && !*req.Prestart, UpdatedAt: time.Now().UTC(),
	}
	if err := m.store.PutPoolSetting(ctx, p); err != nil {
		return httpapi.PoolSetting{}, err
	}
	prev, had := m.set[k]
	m.set[k] = p
	state, err := m.apply(ctx, k)
	if err != nil {
		// Not applied: the setting before it is what stays.
		rctx := context.WithoutCancel(ctx)
		var rerr error
		if had {
			rerr = m.store.PutPoolSetting(rctx, prev)
			m.set[k] = prev
		} else {
			rerr = m.store.DeletePoolSetting(rctx, k.template, k.driver)
			delete(m.set, k)
		}
		m.logRollback(k, rerr)
		return httpapi.PoolSetting{}, err
	}
	m.log.Info("warm pool set", "template", k.template, "driver", k.driver, "size", p.Size, "max", p.Max, "memory_mb", p.MemoryMB, "cpu", p.CPU, "prestart", !p.NoPrestart, "state", state)
	return m.view(k, state), nil
}

// logRollback says when a change that could not be applied could not be
// undone in the store either: the server runs the setting before it, and
// the next start reads the refused one.
func (m *poolManager) logRollback(k poolKey, err error) {
	if err != nil {
		m.log.Error("warm pool setting: rolling back the refused change failed; the store holds it and the next start applies it", "template", k.template, "driver", k.driver, "err", err)
	}
}

// ResetPool deletes an admin's pool: the command line's pool of the
// template and driver, if any, applies again. Errors: ErrNotFound when
// none was set.
func (m *poolManager) ResetPool(ctx context.Context, template_, drv string) (httpapi.PoolSetting, error) {
	k, err := m.key(template_, drv, true)
	if err != nil {
		return httpapi.PoolSetting{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, had := m.set[k]
	if err := m.store.DeletePoolSetting(ctx, k.template, k.driver); err != nil {
		return httpapi.PoolSetting{}, err
	}
	delete(m.set, k)
	if !m.drivers[k.driver] {
		// A setting left by a driver this server does not run: gone, and
		// nothing runs to change.
		m.log.Info("warm pool setting deleted", "template", k.template, "driver", k.driver, "state", "off")
		return httpapi.PoolSetting{Template: k.template, Driver: k.driver, Source: "none", State: "off"}, nil
	}
	state, err := m.apply(ctx, k)
	if err != nil {
		// Not applied: the setting stays.
		if had {
			m.logRollback(k, m.store.PutPoolSetting(context.WithoutCancel(ctx), prev))
			m.set[k] = prev
		}
		return httpapi.PoolSetting{}, err
	}
	m.log.Info("warm pool setting deleted", "template", k.template, "driver", k.driver, "state", state)
	return m.view(k, state), nil
}

// Idle lists the pools flags or settings name that do not run now: those
// waiting for their template, and those a setting turned off.
func (m *poolManager) Idle() []httpapi.PoolSetting {
	running := map[poolKey]bool{}
	for _, p := range m.svc.Pools() {
		running[poolKey{p.Template, p.Driver}] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []httpapi.PoolSetting
	for _, k := range m.keys() {
		cfg := m.config(k)
		switch {
		case running[k]:
		case cfg.Size > 0:
			out = append(out, m.view(k, "waiting_for_template"))
		case cfg.Source == "api":
			out = append(out, m.view(k, "off"))
		}
	}
	return out
}

// view is what applies to k now, as the API shows it.
func (m *poolManager) view(k poolKey, state string) httpapi.PoolSetting {
	cfg := m.config(k)
	v := httpapi.PoolSetting{Template: k.template, Driver: k.driver, Size: cfg.Size, Source: cmp.Or(cfg.Source, "none"), State: state}
	if cfg.Size > 0 {
		if c, err := m.svc.CheckPool(cfg); err == nil {
			cfg = c
		}
		v.Max, v.MemoryMB, v.CPU = cfg.Max, cfg.MemoryMB, cfg.CPU
	}
	prestart := cfg.Prestart != nil
	v.Prestart = &prestart
	if p, ok := m.set[k]; ok {
		v.UpdatedAt = p.UpdatedAt
	}
	return v
}
