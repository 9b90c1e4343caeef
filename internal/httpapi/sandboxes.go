package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Sandbox is the API view of a sandbox.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Template  string            `json:"template"`
	Driver    string            `json:"driver"`
	CPU       int               `json:"cpu"`
	MemoryMB  int               `json:"memory_mb"`
	DiskMB    int               `json:"disk_mb"`
	TimeoutS  int               `json:"timeout_s"`
	OnTimeout string            `json:"on_timeout"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	StoppedAt *time.Time        `json:"stopped_at,omitempty"`
	// PublicPorts: its ports answer without a token on the E2B listener.
	PublicPorts bool `json:"public_ports,omitempty"`
	// AutoResume: a request to it while paused resumes it.
	AutoResume bool `json:"auto_resume,omitempty"`
	// SnapshotOnExec: a files snapshot after every command that changed
	// files.
	SnapshotOnExec bool `json:"snapshot_on_exec,omitempty"`
}

func viewSandbox(sb store.Sandbox) Sandbox {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return Sandbox{
		ID: sb.ID, State: sb.State, Reason: sb.Reason, Template: sb.Template, Driver: sb.Driver,
		CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, TimeoutS: sb.TimeoutS, OnTimeout: sb.OnTimeout,
		Metadata: md, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, StoppedAt: sb.StoppedAt,
		PublicPorts: sb.PublicPorts, AutoResume: sb.AutoResume, SnapshotOnExec: sb.SnapshotOnExec,
	}
}

func (a *API) createSandbox(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req sandbox.CreateRequest
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	sb, err := a.svc.Create(r.Context(), c, req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewSandbox(sb))
}

func (a *API) listSandboxes(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	o := sandbox.ListOptions{Cursor: q.Get("cursor")}
	for _, s := range q["state"] {
		for _, st := range strings.Split(s, ",") {
			if st != "" {
				o.States = append(o.States, st)
			}
		}
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			a.writeError(w, r, errdefs.InvalidArgument("metadata: filter must be key=value"))
			return
		}
		if o.Metadata == nil {
			o.Metadata = map[string]string{}
		}
		o.Metadata[k] = v
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			a.writeError(w, r, errdefs.InvalidArgument("limit: must be between 1 and 1000"))
			return
		}
		o.Limit = n
	}
	sbs, next, err := a.svc.List(r.Context(), c, o)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := struct {
		Sandboxes  []Sandbox `json:"sandboxes"`
		NextCursor string    `json:"next_cursor,omitempty"`
	}{Sandboxes: []Sandbox{}, NextCursor: next}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, viewSandbox(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *API) getSandbox(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := a.svc.Get(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewSandbox(sb))
}

// usageView is GET /v1/sandboxes/{id}/metrics.
type usageView struct {
	Timestamp      time.Time `json:"timestamp"`
	CPUCount       int       `json:"cpu_count"`
	CPUUsedPct     float64   `json:"cpu_used_pct"`
	MemUsedBytes   int64     `json:"mem_used_bytes"`
	MemTotalBytes  int64     `json:"mem_total_bytes"`
	MemCacheBytes  int64     `json:"mem_cache_bytes"`
	DiskUsedBytes  int64     `json:"disk_used_bytes"`
	DiskTotalBytes int64     `json:"disk_total_bytes"`
}

func (a *API) usage(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	u, err := a.svc.Usage(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, usageView{
		Timestamp: u.At, CPUCount: u.CPUCount, CPUUsedPct: math.Round(u.CPUUsedPct*10) / 10,
		MemUsedBytes: u.MemUsed, MemTotalBytes: u.MemTotal, MemCacheBytes: u.MemCache,
		DiskUsedBytes: u.DiskUsed, DiskTotalBytes: u.DiskTotal,
	})
}

func (a *API) killSandbox(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := a.svc.Kill(r.Context(), c, r.PathValue("id")); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) setTimeout(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		TimeoutS int `json:"timeout_s"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	sb, err := a.svc.SetTimeout(r.Context(), c, r.PathValue("id"), req.TimeoutS)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewSandbox(sb))
}

func (a *API) pause(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := a.svc.Pause(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewSandbox(sb))
}

func (a *API) resume(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := a.svc.Resume(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewSandbox(sb))
}
