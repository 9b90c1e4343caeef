package httpapi

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/base32"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

type bytesBuffer struct{ bytes.Buffer }

var teamRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.\-]{0,63}$`)

func requireAdmin(c sandbox.Caller) error {
	if !c.Admin {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "this call needs an admin key")
	}
	return nil
}

// NewKey returns a fresh API key secret.
func NewKey() string {
	b := make([]byte, 24)
	rand.Read(b)
	return "sk_space_" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b)
}

// NewKeyID returns a fresh public key id.
func NewKeyID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "key-" + base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(b)
}

type keyView struct {
	ID        string    `json:"id"`
	Key       string    `json:"key,omitempty"`
	Team      string    `json:"team"`
	Name      string    `json:"name,omitempty"`
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
}

func (a *API) createKey(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	var req struct {
		Team string `json:"team"`
		Name string `json:"name"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if !teamRE.MatchString(req.Team) {
		a.writeError(w, r, errdefs.InvalidArgument("team: required; lowercase letters, digits, '.', '_', '-'"))
		return
	}
	if req.Team == "admin" {
		// The bootstrap admin's sandboxes are the admin team's: a team key
		// of that name would see and kill them.
		a.writeError(w, r, errdefs.InvalidArgument("team: admin is reserved for the server's admin key"))
		return
	}
	if len(req.Name) > 128 {
		a.writeError(w, r, errdefs.InvalidArgument("name: at most 128 bytes"))
		return
	}
	secret := NewKey()
	k := store.Key{ID: NewKeyID(), Hash: HashKey(secret), Team: req.Team, Name: req.Name, CreatedAt: time.Now().UTC()}
	if err := a.cfg.Store.CreateKey(r.Context(), k); err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, keyView{ID: k.ID, Key: secret, Team: k.Team, Name: k.Name, CreatedAt: k.CreatedAt})
}

func (a *API) listKeys(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	keys, err := a.cfg.Store.ListKeys(r.Context(), "")
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := []keyView{}
	for _, k := range keys {
		out = append(out, keyView{ID: k.ID, Team: k.Team, Name: k.Name, Admin: k.Admin, CreatedAt: k.CreatedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

func (a *API) deleteKey(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	if err := a.cfg.Store.DeleteKey(r.Context(), r.PathValue("id")); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type templateView struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	Kind      string    `json:"kind"`
	SizeBytes int64     `json:"size_bytes"`
	Status    string    `json:"status"`
	Error     string    `json:"error,omitempty"`
	Progress  string    `json:"progress,omitempty"`
	BuiltAt   time.Time `json:"built_at"`
}

func viewTemplate(t store.Template) templateView {
	return templateView{Name: t.Name, Digest: t.Digest, Kind: t.Kind, SizeBytes: t.SizeBytes, Status: t.Status, Error: t.Error, Progress: t.Progress, BuiltAt: t.BuiltAt}
}

func (a *API) listTemplates(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	ts, err := a.cfg.Templates.List(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := []templateView{}
	for _, t := range ts {
		out = append(out, viewTemplate(t))
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

// listPools shows the warm pools (admin: pools serve every team).
func (a *API) listPools(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	pools := a.svc.Pools()
	if a.cfg.Pools != nil {
		// Those that do not run, so that a pool waiting for its
		// template's build, or turned off, is seen as well.
		for _, p := range a.cfg.Pools.Idle() {
			pools = append(pools, sandbox.PoolStatus{
				Template: p.Template, Driver: p.Driver, CPU: p.CPU, MemoryMB: p.MemoryMB,
				Size: p.Size, Max: p.Max, Source: p.Source, State: p.State,
			})
		}
	}
	slices.SortStableFunc(pools, func(a, b sandbox.PoolStatus) int {
		return cmp.Or(cmp.Compare(a.Template, b.Template), cmp.Compare(a.Driver, b.Driver))
	})
	writeJSON(w, http.StatusOK, map[string]any{"pools": pools})
}

// buildTemplate builds (or finds cached) a template and streams progress
// lines as SSE.
func (a *API) buildTemplate(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	rc := http.NewResponseController(w)
	var (
		mu      sync.Mutex
		buf     bytes.Buffer
		started bool // the SSE answer began: errors from now on are events
	)
	// The stream starts with the first progress line, so a request that
	// fails at once (an unknown template) gets a JSON error and its status.
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
		}
	}
	emit := func(event string, v any) {
		mu.Lock()
		defer mu.Unlock()
		start()
		buf.Reset()
		writeSSE(&buf, "", event, v)
		w.Write(buf.Bytes())
		_ = rc.Flush()
	}
	t, err := a.cfg.Templates.Build(r.Context(), name, func(line string) {
		emit("progress", map[string]string{"line": line})
	})
	if err != nil {
		mu.Lock()
		early := !started
		mu.Unlock()
		if early {
			a.writeError(w, r, err)
			return
		}
		b, _ := errorBody(err)
		emit("error", b)
		return
	}
	emit("done", viewTemplate(t))
}
