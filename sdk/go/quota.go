package space

import (
	"context"
	"net/http"
)

// Quota is a team's limits and what it holds against them. A limit of 0
// is no limit.
type Quota struct {
	Team         string `json:"team"`
	MaxSandboxes int    `json:"max_sandboxes"` // sandboxes held at once, running or paused
	MaxMemoryMB  int    `json:"max_memory_mb"` // the sum of their memory
	MaxCPU       int    `json:"max_cpu"`       // the sum of their CPUs
	// MaxSnapshotMB limits the data the team's snapshots hold (each
	// distinct chunk once, before compression); past it snapshots fail
	// with IsQuotaExceeded and automatic ones are skipped.
	MaxSnapshotMB int `json:"max_snapshot_mb"`
	// MaxRPS limits the team's API requests per second (a second's worth
	// may come at once); past it requests fail with IsRateLimited.
	MaxRPS int `json:"max_rps"`
	// MaxDiskMB limits the sum of the disk_mb of the sandboxes held.
	MaxDiskMB int `json:"max_disk_mb"`
	// Source is "team" (the team's own quota) or "default" (the server's).
	Source string     `json:"source"`
	Usage  QuotaUsage `json:"usage"`
}

// QuotaUsage is what a team holds now.
type QuotaUsage struct {
	Sandboxes  int   `json:"sandboxes"`
	MemoryMB   int   `json:"memory_mb"`
	CPU        int   `json:"cpu"`
	DiskMB     int   `json:"disk_mb"`     // the sum of the sandboxes' disk_mb
	SnapshotMB int64 `json:"snapshot_mb"` // data its snapshots hold, rounded up
}

// SetQuotaRequest is the body of PUT /v1/teams/{team}/quota. A nil limit
// is no limit; give at least one.
type SetQuotaRequest struct {
	MaxSandboxes  *int `json:"max_sandboxes,omitempty"`
	MaxMemoryMB   *int `json:"max_memory_mb,omitempty"`
	MaxCPU        *int `json:"max_cpu,omitempty"`
	MaxSnapshotMB *int `json:"max_snapshot_mb,omitempty"`
	MaxRPS        *int `json:"max_rps,omitempty"`
	MaxDiskMB     *int `json:"max_disk_mb,omitempty"`
}

// GetQuota returns a team's quota and usage. A team key reads only its own
// team's; an admin key any.
func (c *Client) GetQuota(ctx context.Context, team string) (*Quota, error) {
	var q Quota
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/teams/" + seg(team) + "/quota"}, &q); err != nil {
		return nil, err
	}
	return &q, nil
}

// SetQuota (admin) gives a team a quota of its own, replacing the server's
// default for it. Creates, forks and restores past it fail with
// IsQuotaExceeded, as do snapshots once the team's hold MaxSnapshotMB.
func (c *Client) SetQuota(ctx context.Context, team string, req SetQuotaRequest) (*Quota, error) {
	var q Quota
	if err := c.do(ctx, request{method: http.MethodPut, path: "/v1/teams/" + seg(team) + "/quota", json: req}, &q); err != nil {
		return nil, err
	}
	return &q, nil
}

// DeleteQuota (admin) returns a team to the server's default quota.
func (c *Client) DeleteQuota(ctx context.Context, team string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/teams/" + seg(team) + "/quota"}, nil)
}
