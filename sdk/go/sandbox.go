package space

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"
)

// State is a sandbox's lifecycle state.
type State string

// Sandbox states.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateError    State = "error"
)

// Sandbox is a sandbox as the server reports it.
type Sandbox struct {
	ID        string            `json:"id"`
	State     State             `json:"state"`
	Reason    string            `json:"reason,omitempty"` // why it is stopped or in error
	Template  string            `json:"template"`
	Driver    string            `json:"driver"`
	CPU       int               `json:"cpu"`
	MemoryMB  int               `json:"memory_mb"`
	DiskMB    int               `json:"disk_mb"` // the most host disk its files may fill
	TimeoutS  int               `json:"timeout_s"`
	OnTimeout string            `json:"on_timeout,omitempty"` // "kill" or "pause"
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	StoppedAt *time.Time        `json:"stopped_at,omitempty"`
	// PublicPorts: its ports answer without a token on the server's E2B
	// listener (<port>-<id>.<domain>).
	PublicPorts bool `json:"public_ports,omitempty"`
	// AutoResume: while paused, a request to its processes, files or ports
	// resumes it first.
	AutoResume bool `json:"auto_resume,omitempty"`
	// SnapshotOnExec: a files snapshot after every command that changed
	// files.
	SnapshotOnExec bool `json:"snapshot_on_exec,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. Zero fields take the
// server's defaults.
type CreateSandboxRequest struct {
	Template  string            `json:"template,omitempty"`   // default "base"
	TimeoutS  int               `json:"timeout_s,omitempty"`  // seconds until OnTimeout happens
	OnTimeout string            `json:"on_timeout,omitempty"` // "kill" (default) or "pause"
	Env       map[string]string `json:"env,omitempty"`        // environment of every process
	Metadata  map[string]string `json:"metadata,omitempty"`   // free-form labels, filterable in lists
	CPU       int               `json:"cpu,omitempty"`
	MemoryMB  int               `json:"memory_mb,omitempty"`
	// DiskMB is the most host disk the sandbox's files may fill (default
	// 10240); it counts against the team's MaxDiskMB.
	DiskMB int `json:"disk_mb,omitempty"`
	// Snapshot, when set, creates the sandbox from that snapshot (its
	// template is the snapshot's; Template must then be empty).
	Snapshot string `json:"snapshot,omitempty"`
	// Network is the egress policy; nil: no network at all.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Secrets names the team's secrets the sandbox may use: its environment
	// gets a placeholder for each, swapped for the value by the egress proxy
	// only on the way to the secret's hosts.
	Secrets []string `json:"secrets,omitempty"`
	// PublicPorts lets anyone who knows a port's <port>-<id>.<domain> name
	// on the server's E2B listener reach it without a token (E2B's
	// allowPublicTraffic). The /v1 port path (PortURL, PortTransport)
	// always needs the API key.
	PublicPorts bool `json:"public_ports,omitempty"`
	// AutoResume: while the sandbox is paused (OnTimeout "pause", or a
	// Pause), a request to its processes, files or ports resumes it first
	// (E2B's autoResume). Forks and restores keep it.
	AutoResume bool `json:"auto_resume,omitempty"`
	// SnapshotOnExec: a files snapshot after every command that changed
	// files, naming the command (see FileHistory, RestoreBefore); nil
	// takes the server's default (off unless space serve
	// --snapshot-on-exec).
	SnapshotOnExec *bool `json:"snapshot_on_exec,omitempty"`
}

// CreateSandbox creates and starts a sandbox. It returns when the sandbox is
// running (or has failed to start).
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes", json: req}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns one sandbox; IsNotFound(err) when it does not exist.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id)}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Metrics is one sample of a running sandbox's resource use.
type Metrics struct {
	Timestamp      time.Time `json:"timestamp"`
	CPUCount       int       `json:"cpu_count"`
	CPUUsedPct     float64   `json:"cpu_used_pct"` // share of the sandbox's CPUs busy since the previous sample, 0–100
	MemUsedBytes   int64     `json:"mem_used_bytes"`
	MemTotalBytes  int64     `json:"mem_total_bytes"`
	MemCacheBytes  int64     `json:"mem_cache_bytes"`
	DiskUsedBytes  int64     `json:"disk_used_bytes"`
	DiskTotalBytes int64     `json:"disk_total_bytes"`
}

// SandboxMetrics reads a running sandbox's CPU, memory and disk use (a
// conflict error naming the state when it is not running).
func (c *Client) SandboxMetrics(ctx context.Context, id string) (*Metrics, error) {
	var m Metrics
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id) + "/metrics"}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// KillSandbox destroys a sandbox and everything in it.
func (c *Client) KillSandbox(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/sandboxes/" + seg(id)}, nil)
}

// SetTimeout resets a sandbox's timeout: it now expires timeoutS seconds from
// now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeoutS int) (*Sandbox, error) {
	var sb Sandbox
	body := struct {
		TimeoutS int `json:"timeout_s"`
	}{timeoutS}
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes/" + seg(id) + "/timeout", json: body}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters and pages GET /v1/sandboxes.
type ListOptions struct {
	State    []State           // any of these states; empty means all
	Metadata map[string]string // every pair must match
	Limit    int               // page size; 0 means the server's default
	Cursor   string            // NextCursor of the previous page
}

// SandboxList is one page of sandboxes.
type SandboxList struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	NextCursor string    `json:"next_cursor,omitempty"` // empty on the last page
}

// ListSandboxes returns one page of sandboxes. Pass the page's NextCursor in
// opts.Cursor to get the next one, or use AllSandboxes.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) (*SandboxList, error) {
	q := url.Values{}
	for _, s := range opts.State {
		q.Add("state", string(s))
	}
	keys := make([]string, 0, len(opts.Metadata))
	for k := range opts.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("metadata", k+"="+opts.Metadata[k])
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	var out SandboxList
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AllSandboxes iterates over every sandbox matching opts, following cursors
// page by page. Iteration stops after the first error, which is yielded.
func (c *Client) AllSandboxes(ctx context.Context, opts ListOptions) iter.Seq2[Sandbox, error] {
	return func(yield func(Sandbox, error) bool) {
		for {
			page, err := c.ListSandboxes(ctx, opts)
			if err != nil {
				yield(Sandbox{}, err)
				return
			}
			for _, sb := range page.Sandboxes {
				if !yield(sb, nil) {
					return
				}
			}
			if page.NextCursor == "" || page.NextCursor == opts.Cursor {
				return
			}
			opts.Cursor = page.NextCursor
		}
	}
}
