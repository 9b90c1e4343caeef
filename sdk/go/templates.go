package space

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Template is a root filesystem sandboxes are created from.
type Template struct {
	Name        string    `json:"name"`
	Digest      string    `json:"digest"`
	Kind        string    `json:"kind"`
	SizeBytes   int64     `json:"size_bytes"`
	Status      string    `json:"status"`
	BuiltAt     time.Time `json:"built_at"` // zero when never built
	Description string    `json:"description"`
}

// Templates lists the server's templates.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/templates"}, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// Pool is a warm pool: sandboxes of one template and shape started ahead
// of demand, handed to creates of that shape.
type Pool struct {
	Template  string `json:"template"`
	Digest    string `json:"digest"` // the template build its sandboxes are made from
	Driver    string `json:"driver"`
	CPU       int    `json:"cpu"`
	MemoryMB  int    `json:"memory_mb"`
	Size      int    `json:"size"`       // the base size it keeps ready
	Max       int    `json:"max"`        // the most its target grows to
	Target    int    `json:"target"`     // what it refills to now
	Ready     int    `json:"ready"`      // warm sandboxes waiting for a create
	FromImage bool   `json:"from_image"` // refills by restoring a post-boot checkpoint
	// Prestart is the command each of its sandboxes runs before it joins
	// the pool (the E2B code interpreter's kernel), absent when none.
	Prestart []string `json:"prestart,omitempty"`
	// Source is where its size comes from: "flags" (the server's command
	// line) or "api" (SetPool).
	Source string `json:"source,omitempty"`
	// State is "running", or for a pool that does not run,
	// "waiting_for_template" (it starts once its template is built) or
	// "off" (a setting of size 0); those have no Digest and nothing ready.
	State string `json:"state"`
}

// SetPoolRequest is a warm pool of one template and driver as an admin
// sets it. Zero fields take the defaults: the server's driver, 4×Size for
// Max, a create's memory and CPUs.
type SetPoolRequest struct {
	Size     int    `json:"size"` // warm sandboxes kept ready; 0 turns the pool off
	Max      int    `json:"max,omitempty"`
	Driver   string `json:"driver,omitempty"`
	MemoryMB int    `json:"memory_mb,omitempty"`
	CPU      int    `json:"cpu,omitempty"`
	// Prestart false turns off the process the template's pools start in
	// each warm sandbox (the E2B code interpreter's kernel); nil keeps it.
	Prestart *bool `json:"prestart,omitempty"`
}

// PoolSetting is the warm pool of one template and driver that applies
// after SetPool or ResetPool.
type PoolSetting struct {
	Template string `json:"template"`
	Driver   string `json:"driver"`
	Size     int    `json:"size"`
	Max      int    `json:"max"`
	MemoryMB int    `json:"memory_mb"`
	CPU      int    `json:"cpu"`
	// Prestart: whether the pool's sandboxes start a process before they
	// join it.
	Prestart bool `json:"prestart"`
	// Source: "api" (a stored setting), "flags" (the command line), "none".
	Source string `json:"source"`
	// State: "running", "waiting_for_template" (it starts once the
	// template is built), "off".
	State     string    `json:"state"`
	UpdatedAt time.Time `json:"updated_at"` // zero when no setting applies
}

// SetPool (admin) sets a template's warm pool on a driver while the
// server runs, replacing the command line's; the setting outlives
// restarts until ResetPool.
func (c *Client) SetPool(ctx context.Context, template string, req SetPoolRequest) (*PoolSetting, error) {
	var out PoolSetting
	if err := c.do(ctx, request{method: http.MethodPut, path: "/v1/pools/" + seg(template), json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ResetPool (admin) deletes the setting SetPool made for a template on a
// driver ("": the server's default), so the command line's pool applies
// again.
func (c *Client) ResetPool(ctx context.Context, template, driver string) (*PoolSetting, error) {
	var q url.Values
	if driver != "" {
		q = url.Values{"driver": {driver}}
	}
	var out PoolSetting
	if err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/pools/" + seg(template), query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pools (admin) lists the server's warm pools: those running, and those
// configured that do not run (State).
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out struct {
		Pools []Pool `json:"pools"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/pools"}, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// BuildTemplate (admin) builds or rebuilds a template, calling progress (when
// non-nil) with each line of build output, and returns the built template. A
// failed build returns the server's *APIError.
func (c *Client) BuildTemplate(ctx context.Context, name string, progress func(line string)) (*Template, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodPost,
		path:   "/v1/templates/" + seg(name) + "/build",
		header: http.Header{"Accept": {"text/event-stream"}},
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sse := newSSEReader(resp.Body)
	for {
		ev, err := sse.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("space: template build stream ended without a result: %w", io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, err
		}
		switch ev.Event {
		case "progress":
			var d struct {
				Line string `json:"line"`
			}
			if err := json.Unmarshal([]byte(ev.Data), &d); err != nil {
				return nil, fmt.Errorf("space: decode progress event: %w", err)
			}
			if progress != nil {
				progress(d.Line)
			}
		case "done":
			var t Template
			if err := json.Unmarshal([]byte(ev.Data), &t); err != nil {
				return nil, fmt.Errorf("space: decode done event: %w", err)
			}
			return &t, nil
		case "error":
			e := &APIError{}
			if json.Unmarshal([]byte(ev.Data), e) != nil || e.Code == "" {
				e = &APIError{Status: 500, Code: CodeInternal, Message: ev.Data}
			}
			return nil, e
		}
	}
}
