package httpapi

import (
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Largest limits a quota may name (beyond them a limit means nothing on
// one host, and a typo should not read as "unlimited").
const (
	maxQuotaSandboxes  = 100000
	maxQuotaMemoryMB   = 1 << 30
	maxQuotaCPU        = 1 << 20
	maxQuotaRPS        = 1 << 20
	maxQuotaSnapshotMB = 1 << 40
	maxQuotaDiskMB     = 1 << 40
)

type quotaView struct {
	Team          string        `json:"team"`
	MaxSandboxes  int           `json:"max_sandboxes"`   // 0: no limit
	MaxMemoryMB   int           `json:"max_memory_mb"`   // 0: no limit
	MaxCPU        int           `json:"max_cpu"`         // 0: no limit
	MaxSnapshotMB int           `json:"max_snapshot_mb"` // 0: no limit
	MaxRPS        int           `json:"max_rps"`         // 0: no limit
	MaxDiskMB     int           `json:"max_disk_mb"`     // 0: no limit
	Source        string        `json:"source"`          // "team" (its own) or "default" (the server's)
	Usage         teamUsageView `json:"usage"`
}

type teamUsageView struct {
	Sandboxes  int   `json:"sandboxes"`
	MemoryMB   int   `json:"memory_mb"`
	CPU        int   `json:"cpu"`
	DiskMB     int   `json:"disk_mb"`     // the sum of the live sandboxes' disk_mb
	SnapshotMB int64 `json:"snapshot_mb"` // rounded up
}

func viewQuota(v sandbox.QuotaView) quotaView {
	src := "default"
	if v.Own {
		src = "team"
	}
	return quotaView{Team: v.Team, MaxSandboxes: v.Quota.MaxSandboxes, MaxMemoryMB: v.Quota.MaxMemoryMB, MaxCPU: v.Quota.MaxCPU, MaxSnapshotMB: v.Quota.MaxSnapshotMB,
		MaxRPS: v.Quota.MaxRPS, MaxDiskMB: v.Quota.MaxDiskMB, Source: src,
		Usage: teamUsageView{Sandboxes: v.Usage.Sandboxes, MemoryMB: v.Usage.MemoryMB, CPU: v.Usage.CPU, DiskMB: v.Usage.DiskMB, SnapshotMB: (v.SnapshotBytes + 1<<20 - 1) >> 20}}
}

// teamOf reads and checks the {team} path value.
func teamOf(r *http.Request) (string, error) {
	team := r.PathValue("team")
	if !teamRE.MatchString(team) {
		return "", errdefs.InvalidArgument("team: lowercase letters, digits, '.', '_', '-'")
	}
	return team, nil
}

func (a *API) getQuota(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	team, err := teamOf(r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	a.writeQuota(w, r, c, team)
}

// writeQuota answers with team's quota in force and its use.
func (a *API) writeQuota(w http.ResponseWriter, r *http.Request, c sandbox.Caller, team string) {
	v, err := a.svc.QuotaOf(r.Context(), c, team)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewQuota(v))
}

// adminTeam checks an admin call on /v1/teams/{team}; false: answered.
func (a *API) adminTeam(w http.ResponseWriter, r *http.Request, c sandbox.Caller) (string, bool) {
	err := requireAdmin(c)
	team := ""
	if err == nil {
		team, err = teamOf(r)
	}
	if err != nil {
		a.writeError(w, r, err)
		return "", false
	}
	return team, true
}

func (a *API) putQuota(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	team, ok := a.adminTeam(w, r, c)
	if !ok {
		return
	}
	var req struct {
		MaxSandboxes  *int `json:"max_sandboxes"`
		MaxMemoryMB   *int `json:"max_memory_mb"`
		MaxCPU        *int `json:"max_cpu"`
		MaxSnapshotMB *int `json:"max_snapshot_mb"`
		MaxRPS        *int `json:"max_rps"`
		MaxDiskMB     *int `json:"max_disk_mb"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if req.MaxSandboxes == nil && req.MaxMemoryMB == nil && req.MaxCPU == nil && req.MaxSnapshotMB == nil && req.MaxRPS == nil && req.MaxDiskMB == nil {
		a.writeError(w, r, errdefs.InvalidArgument("give max_sandboxes, max_memory_mb, max_cpu, max_snapshot_mb, max_rps, max_disk_mb or some of them (0: no limit); DELETE returns the team to the server's default"))
		return
	}
	var q store.Quota
	for _, f := range []struct {
		name string
		v    *int
		max  int
		dst  *int
	}{
		{"max_sandboxes", req.MaxSandboxes, maxQuotaSandboxes, &q.MaxSandboxes},
		{"max_memory_mb", req.MaxMemoryMB, maxQuotaMemoryMB, &q.MaxMemoryMB},
		{"max_cpu", req.MaxCPU, maxQuotaCPU, &q.MaxCPU},
		{"max_snapshot_mb", req.MaxSnapshotMB, maxQuotaSnapshotMB, &q.MaxSnapshotMB},
		{"max_rps", req.MaxRPS, maxQuotaRPS, &q.MaxRPS},
		{"max_disk_mb", req.MaxDiskMB, maxQuotaDiskMB, &q.MaxDiskMB},
	} {
		if f.v == nil {
			continue // a limit not given is no limit
		}
		if *f.v < 0 || *f.v > f.max {
			a.writeError(w, r, errdefs.InvalidArgument("%s: between 0 (no limit) and %d", f.name, f.max))
			return
		}
		*f.dst = *f.v
	}
	if err := a.svc.SetQuota(r.Context(), c, team, q); err != nil {
		a.writeError(w, r, err)
		return
	}
	a.writeQuota(w, r, c, team)
}

func (a *API) deleteQuota(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	team, ok := a.adminTeam(w, r, c)
	if !ok {
		return
	}
	if err := a.svc.DeleteQuota(r.Context(), c, team); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
