package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
)

// templates joins the template builder (the shared, content-addressed
// cache of root filesystems) with this server's records of named templates.
type templates struct {
	store   *store.Store
	builder *template.Builder
	log     *slog.Logger
	mu      sync.Mutex // one build per server at a time; the builder locks across processes
	// settled is set (mu held) once the records a crashed server left
	// building were settled, which the first Build does.
	settled bool
	// ready, when set (before the server serves), is called with the
	// record of every template a Build found or made ready (warm pools
	// start or follow a rebuild).
	ready func(store.Template)
	// failed, when set, is called with the name of a template whose build
	// failed with no earlier good build to keep: creates refuse it, so its
	// warm pools can serve none.
	failed func(name string)

	pendMu sync.Mutex
	// pending holds the builds queued or running, by template name:
	// creates of a template not ready yet wait for its entry's done
	// (Await). progress is the last line each has printed.
	pending  map[string]*pendingBuild
	progress map[string]string
}

// pendingBuild counts the builds of one template queued or running
// (expect, Build); done is closed when the count drops to zero.
type pendingBuild struct {
	n    int
	done chan struct{}
}

// Statuses List adds to the stored ones.
const (
	statusQueued   = "queued"    // to be built by this server (at start, or behind another build)
	statusNotBuilt = "not_built" // a built-in recipe nobody built yet
)

// expect counts a build of name about to start: from now on a create of
// name waits for it (a build at start that has not taken the build lock
// yet). settle undoes it.
func (t *templates) expect(name string) {
	t.pendMu.Lock()
	defer t.pendMu.Unlock()
	if t.pending == nil {
		t.pending = map[string]*pendingBuild{}
		t.progress = map[string]string{}
	}
	p := t.pending[name]
	if p == nil {
		p = &pendingBuild{done: make(chan struct{})}
		t.pending[name] = p
	}
	p.n++
}

func (t *templates) settle(name string) {
	t.pendMu.Lock()
	defer t.pendMu.Unlock()
	if p := t.pending[name]; p != nil {
		if p.n--; p.n == 0 {
			close(p.done)
			delete(t.pending, name)
			delete(t.progress, name)
		}
	}
}

func (t *templates) noteProgress(name, line string) {
	t.pendMu.Lock()
	if t.progress != nil && t.pending[name] != nil {
		t.progress[name] = line
	}
	t.pendMu.Unlock()
}

// Await blocks while a build of name is queued or running, until it ends
// or ctx does. It reports whether there was one to wait for; the error is
// ctx's when it ended first.
func (t *templates) Await(ctx context.Context, name string) (bool, error) {
	if t == nil {
		return false, nil
	}
	t.pendMu.Lock()
	p := t.pending[name]
	t.pendMu.Unlock()
	if p == nil {
		return false, nil
	}
	select {
	case <-p.done:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// pendingState returns whether a build of name is queued or running and
// the last line it printed.
func (t *templates) pendingState(name string) (bool, string) {
	t.pendMu.Lock()
	defer t.pendMu.Unlock()
	return t.pending[name] != nil, t.progress[name]
}

// List returns the built templates and, for built-in recipes not built yet,
// an entry with status "not_built" so callers can see what exists. A
// template this server is about to build, or building, that does not
// serve yet is "queued" until its build starts, then "building", with the
// build's last progress line.
func (t *templates) List(ctx context.Context) ([]store.Template, error) {
	recs, err := t.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, r := range recs {
		have[r.Name] = true
	}
	for _, r := range template.Builtins() {
		if !have[r.Name] {
			recs = append(recs, store.Template{Name: r.Name, Digest: r.Digest(), Kind: string(template.KindDir), Status: statusNotBuilt})
		}
	}
	for i, r := range recs {
		pending, line := t.pendingState(r.Name)
		if !pending {
			continue
		}
		recs[i].Progress = line
		if r.Status != store.TemplateReady && r.Status != store.TemplateBuilding {
			recs[i].Status = statusQueued
		}
	}
	return recs, nil
}

// Build builds a built-in template (a cache hit when any server on the host
// built the same recipe) and records it as ready. A template with a good
// build keeps it while a new recipe builds: creates and warm pools use
// the record's digest and path, which change only once the new build is
// complete, and a failed or cancelled rebuild leaves them as they were
// (the record's error says why it failed).
func (t *templates) Build(ctx context.Context, name string, progress func(string)) (store.Template, error) {
	r, err := template.Builtin(name)
	if err != nil {
		return store.Template{}, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	t.expect(name)
	defer t.settle(name)
	report := progress
	progress = func(line string) {
		t.noteProgress(name, line)
		report(line)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.settled {
		t.settled = t.settleLocked(ctx) == nil
	}
	recipe, _ := json.Marshal(r)
	prev, serving := t.serving(ctx, name)
	if serving && prev.Digest == r.Digest() {
		progress("template " + name + " is up to date (" + r.Digest()[:12] + ")")
		if prev.Error != "" { // a failed rebuild to a recipe since dropped
			prev.Error = ""
			if err := t.store.PutTemplate(ctx, prev); err != nil {
				return store.Template{}, err
			}
		}
		t.announce(prev)
		return prev, nil
	}
	if serving {
		progress("template " + name + ": building " + r.Digest()[:12] + "; " + prev.Digest[:12] + " serves meanwhile")
		t.announce(prev) // its pools run until the new build replaces them
	} else if err := t.store.PutTemplate(ctx, store.Template{Name: name, Digest: r.Digest(), Kind: string(template.KindDir), Recipe: recipe, Status: store.TemplateBuilding}); err != nil {
		return store.Template{}, err
	}
	built, err := t.builder.Build(ctx, r, progress)
	if err != nil {
		if serving {
			prev.Error = "build of " + r.Digest()[:12] + " failed (" + prev.Digest[:12] + " still serves): " + err.Error()
			if perr := t.store.PutTemplate(context.WithoutCancel(ctx), prev); perr != nil {
				t.log.Error("template: recording a failed rebuild", "template", name, "err", perr)
			}
		} else {
			_ = t.store.PutTemplate(context.WithoutCancel(ctx), store.Template{Name: name, Digest: r.Digest(), Kind: string(template.KindDir), Recipe: recipe, Status: store.TemplateFailed, Error: err.Error()})
			if t.failed != nil {
				t.failed(name)
			}
		}
		if ctx.Err() != nil {
			return store.Template{}, errdefs.Unavailable("template build of %s cancelled", name)
		}
		return store.Template{}, err
	}
	rec := store.Template{
		Name: name, Digest: built.Digest, Path: built.Path, Kind: string(built.Kind),
		SizeBytes: built.SizeBytes, Recipe: recipe, Status: store.TemplateReady, BuiltAt: built.BuiltAt,
	}
	if err := t.store.PutTemplate(ctx, rec); err != nil {
		return store.Template{}, err
	}
	t.announce(rec)
	return rec, nil
}

// serving returns the record of name and whether it serves creates: ready,
// with its build complete in the cache.
func (t *templates) serving(ctx context.Context, name string) (store.Template, bool) {
	rec, err := t.store.GetTemplate(ctx, name)
	if err != nil || rec.Status != store.TemplateReady {
		return rec, false
	}
	if _, err := t.builder.Lookup(rec.Digest); err != nil {
		return rec, false
	}
	return rec, true
}

// settleLocked ends the builds a crashed server left recorded as building
// (a record of this server is building only while t.mu is held): ready
// when the cache has the build complete (the crash came after it), else
// failed until the next build, since nothing is building it any more.
func (t *templates) settleLocked(ctx context.Context) error {
	recs, err := t.store.ListTemplates(ctx)
	if err != nil {
		t.log.Error("template: settling interrupted builds", "err", err)
		return err
	}
	for _, rec := range recs {
		if rec.Status != store.TemplateBuilding {
			continue
		}
		if built, err := t.builder.Lookup(rec.Digest); err == nil {
			rec.Path, rec.Kind, rec.SizeBytes, rec.BuiltAt = built.Path, string(built.Kind), built.SizeBytes, built.BuiltAt
			rec.Status, rec.Error = store.TemplateReady, ""
		} else {
			rec.Status, rec.Error = store.TemplateFailed, "build interrupted: the server stopped during it"
		}
		if err := t.store.PutTemplate(ctx, rec); err != nil {
			t.log.Error("template: settling an interrupted build", "template", rec.Name, "err", err)
			return err
		}
		t.log.Warn("template build was interrupted by a server stop", "template", rec.Name, "status", rec.Status)
		if rec.Status == store.TemplateReady {
			t.announce(rec)
		}
	}
	return nil
}

func (t *templates) announce(rec store.Template) {
	if t.ready != nil {
		t.ready(rec)
	}
}
