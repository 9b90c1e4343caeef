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
	// ready, when set (before the server serves), is called with the
	// record of every template a Build found or made ready (warm pools
	// start or follow a rebuild).
	ready func(store.Template)
	// failed, when set, is called with the name of a template whose build
	// failed: creates refuse it, so its warm pools can serve none.
	failed func(name string)
}

// List returns the built templates and, for built-in recipes not built yet,
// an entry with status "not_built" so callers can see what exists.
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
			recs = append(recs, store.Template{Name: r.Name, Digest: r.Digest(), Kind: string(template.KindDir), Status: "not_built"})
		}
	}
	return recs, nil
}

// Build builds a built-in template (a cache hit when any server on the host
// built the same recipe) and records it as ready.
func (t *templates) Build(ctx context.Context, name string, progress func(string)) (store.Template, error) {
	r, err := template.Builtin(name)
	if err != nil {
		return store.Template{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	recipe, _ := json.Marshal(r)
	if cur, err := t.store.GetTemplate(ctx, name); err == nil && cur.Status == store.TemplateReady && cur.Digest == r.Digest() {
		if _, err := t.builder.Lookup(r.Digest()); err == nil {
			progress("template " + name + " is up to date (" + r.Digest()[:12] + ")")
			t.announce(cur)
			return cur, nil
		}
	}
	if err := t.store.PutTemplate(ctx, store.Template{Name: name, Digest: r.Digest(), Kind: string(template.KindDir), Recipe: recipe, Status: store.TemplateBuilding}); err != nil {
		return store.Template{}, err
	}
	built, err := t.builder.Build(ctx, r, progress)
	if err != nil {
		_ = t.store.PutTemplate(context.WithoutCancel(ctx), store.Template{Name: name, Digest: r.Digest(), Kind: string(template.KindDir), Recipe: recipe, Status: store.TemplateFailed, Error: err.Error()})
		if t.failed != nil {
			t.failed(name)
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

func (t *templates) announce(rec store.Template) {
	if t.ready != nil {
		t.ready(rec)
	}
}
