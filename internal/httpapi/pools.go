package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Pools is what the API needs to change the warm pools while the server
// runs (nil: PUT and DELETE /v1/pools/{template} answer 501).
type Pools interface {
	// SetPool stores a pool of req's template and driver, replacing the
	// command line's, and applies it at once.
	SetPool(ctx context.Context, req PoolSetting) (PoolSetting, error)
	// ResetPool deletes the stored pool of a template and driver, so the
	// command line's applies again. Errors: errdefs.ErrNotFound.
	ResetPool(ctx context.Context, template, driver string) (PoolSetting, error)
	// Idle lists the pools the command line or a setting names that do
	// not run: waiting for their template, or turned off by a setting.
	Idle() []PoolSetting
}

// PoolSetting is a warm pool of one template and driver as an admin sets
// it and as it applies afterwards.
type PoolSetting struct {
	Template string `json:"template"`
	Driver   string `json:"driver"`
	Size     int    `json:"size"`
	Max      int    `json:"max"`
	MemoryMB int    `json:"memory_mb"`
	CPU      int    `json:"cpu"`
	// Prestart, asked: false turns off the process the template's pools
	// start in each warm sandbox (the E2B code interpreter's kernel in
	// python-data pools when the E2B API is on); nil keeps it. Answered:
	// whether the pool's sandboxes start one.
	Prestart *bool `json:"prestart,omitempty"`
	// Source is where the pool that applies comes from: "api" (a stored
	// setting), "flags" (the command line), "none".
	Source string `json:"source"`
	// State: "running", "waiting_for_template" (it starts once the
	// template is built), "off" (size 0).
	State     string    `json:"state"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// putPool sets the warm pool of a template on a driver (admin).
func (a *API) putPool(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	var req struct {
		Driver   string `json:"driver"`
		Size     *int   `json:"size"`
		Max      int    `json:"max"`
		MemoryMB int    `json:"memory_mb"`
		CPU      int    `json:"cpu"`
		Prestart *bool  `json:"prestart"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if req.Size == nil {
		a.writeError(w, r, errdefs.InvalidArgument("give size: the warm sandboxes to keep ready (0 turns the pool off); DELETE returns the template to the command line's pool"))
		return
	}
	if a.cfg.Pools == nil {
		a.writeError(w, r, errdefs.NotSupported("this server cannot change its pools while it runs"))
		return
	}
	out, err := a.cfg.Pools.SetPool(r.Context(), PoolSetting{
		Template: r.PathValue("template"), Driver: req.Driver, Size: *req.Size, Max: req.Max, MemoryMB: req.MemoryMB, CPU: req.CPU, Prestart: req.Prestart,
	})
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// deletePool deletes the pool an admin set for a template on a driver
// (?driver=, default the server's): the command line's applies again.
func (a *API) deletePool(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := requireAdmin(c); err != nil {
		a.writeError(w, r, err)
		return
	}
	if a.cfg.Pools == nil {
		a.writeError(w, r, errdefs.NotSupported("this server cannot change its pools while it runs"))
		return
	}
	out, err := a.cfg.Pools.ResetPool(r.Context(), r.PathValue("template"), r.URL.Query().Get("driver"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
