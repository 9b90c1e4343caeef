package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Quota limits what one team holds at once. A zero field is no limit.
type Quota struct {
	MaxSandboxes  int // sandboxes holding host resources (creating, running, paused, stopping, error)
	MaxMemoryMB   int // the sum of their memory
	MaxCPU        int // the sum of their CPUs (a CPU is one core's time; the host shares its cores)
	MaxSnapshotMB int // distinct data its snapshots hold (checked by the service before each snapshot)
	MaxRPS        int // API requests per second (the service's rate limiter; a second's worth may come at once)
	MaxDiskMB     int // the sum of their disk reservations (Sandbox.DiskMB: the most host disk each may fill)
}

// SandboxesUnlimited reports whether q limits neither the number of
// sandboxes nor their memory, CPUs or disk (what a create checks).
func (q Quota) SandboxesUnlimited() bool {
	return q.MaxSandboxes <= 0 && q.MaxMemoryMB <= 0 && q.MaxCPU <= 0 && q.MaxDiskMB <= 0
}

// Usage is what a team holds now, counted as a Quota counts.
type Usage struct {
	Sandboxes int
	MemoryMB  int
	CPU       int
	DiskMB    int
}

// Size is what one sandbox takes from its team's quota.
type Size struct {
	CPU      int
	MemoryMB int
	DiskMB   int
}

// SizeOf is sb's Size.
func SizeOf(sb Sandbox) Size { return Size{CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB} }

// liveStates are the states that hold host resources. A paused sandbox is
// frozen in memory; one in error is a failed create or destroy whose
// instance may still run (the sandbox service keeps its record until a
// kill destroys it); pooled sandboxes belong to no team. The partial index
// sandboxes_live_team names the same list and holds every column usageSQL
// and withinSQL read, so counting reads the index only (TestUsageReadsIndexOnly):
// every claim counts its team's sandboxes inside the one write transaction.
const liveStates = `('creating', 'running', 'paused', 'stopping', 'error')`

// usageSQL counts a team's live sandboxes, their memory, CPUs and disk.
const usageSQL = `SELECT COUNT(*), COALESCE(SUM(memory_mb), 0), COALESCE(SUM(cpu), 0), COALESCE(SUM(disk_mb), 0) FROM sandboxes WHERE team = ? AND state IN ` + liveStates

// withinSQL is a condition true while a team may take one more sandbox of
// a size under a quota (max sandboxes, max memory, max CPUs, max disk; 0 or
// less is no limit); withinArgs gives its arguments.
const withinSQL = `(SELECT (? <= 0 OR n < ?) AND (? <= 0 OR mem + ? <= ?) AND (? <= 0 OR cpu + ? <= ?) AND (? <= 0 OR disk + ? <= ?) FROM (
	SELECT COUNT(*) AS n, COALESCE(SUM(memory_mb), 0) AS mem, COALESCE(SUM(cpu), 0) AS cpu, COALESCE(SUM(disk_mb), 0) AS disk FROM sandboxes WHERE team = ? AND state IN ` + liveStates + `))`

func withinArgs(team string, sz Size, q Quota) []any {
	return []any{q.MaxSandboxes, q.MaxSandboxes, q.MaxMemoryMB, sz.MemoryMB, q.MaxMemoryMB, q.MaxCPU, sz.CPU, q.MaxCPU, q.MaxDiskMB, sz.DiskMB, q.MaxDiskMB, team}
}

// TeamUsage returns what team holds now.
func (s *Store) TeamUsage(ctx context.Context, team string) (Usage, error) {
	var u Usage
	if err := s.r.QueryRowContext(ctx, usageSQL, team).Scan(&u.Sandboxes, &u.MemoryMB, &u.CPU, &u.DiskMB); err != nil {
		return u, fmt.Errorf("store: team usage: %w", err)
	}
	return u, nil
}

// fits reports whether a team holding u may take n more sandboxes of size
// sz under q.
func (q Quota) fits(u Usage, n int, sz Size) bool {
	return (q.MaxSandboxes <= 0 || u.Sandboxes+n <= q.MaxSandboxes) &&
		(q.MaxMemoryMB <= 0 || u.MemoryMB+n*sz.MemoryMB <= q.MaxMemoryMB) &&
		(q.MaxCPU <= 0 || u.CPU+n*sz.CPU <= q.MaxCPU) &&
		(q.MaxDiskMB <= 0 || u.DiskMB+n*sz.DiskMB <= q.MaxDiskMB)
}

// quotaError is the error of a create the team's quota refuses; it says
// which limit and what the team holds.
func quotaError(team string, q Quota, u Usage, n int, sz Size) error {
	if q.MaxSandboxes > 0 && u.Sandboxes+n > q.MaxSandboxes {
		return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s has %d of its %d sandboxes (not stopped); %d more do not fit", team, u.Sandboxes, q.MaxSandboxes, n)
	}
	if q.MaxCPU > 0 && u.CPU+n*sz.CPU > q.MaxCPU {
		return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s uses %d of its %d CPUs; %d more do not fit", team, u.CPU, q.MaxCPU, n*sz.CPU)
	}
	if q.MaxDiskMB > 0 && u.DiskMB+n*sz.DiskMB > q.MaxDiskMB {
		return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s reserves %d of its %d MiB of sandbox disk; %d MiB more does not fit", team, u.DiskMB, q.MaxDiskMB, n*sz.DiskMB)
	}
	return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s uses %d of its %d MiB of sandbox memory; %d MiB more does not fit", team, u.MemoryMB, q.MaxMemoryMB, n*sz.MemoryMB)
}

// CheckQuota returns an ErrQuotaExceeded error if team cannot take n more
// sandboxes of size sz now. It is advisory (a create checked here
// may still lose a race): CreateSandboxWithin and ClaimSandboxWithin
// decide.
func (s *Store) CheckQuota(ctx context.Context, team string, n int, sz Size, q Quota) error {
	if q.SandboxesUnlimited() {
		return nil
	}
	u, err := s.TeamUsage(ctx, team)
	if err != nil {
		return err
	}
	if !q.fits(u, n, sz) {
		return quotaError(team, q, u, n, sz)
	}
	return nil
}

// refused explains a quota-checked write that changed no row: the quota,
// or (when the quota has room, so the row was the reason) other. It reads
// the usage in the write's own transaction t, so it sees what the write
// saw: read after the commit, a sandbox of the team that stopped meanwhile
// turned a quota refusal into other (a 500 for a create; for a claim "not
// pooled", and the service destroyed a healthy warm sandbox).
func refused(ctx context.Context, t tx, team string, sz Size, q Quota, other error) error {
	if beforeRefusal != nil {
		beforeRefusal()
	}
	var u Usage
	if err := t.QueryRowContext(ctx, usageSQL, team).Scan(&u.Sandboxes, &u.MemoryMB, &u.CPU, &u.DiskMB); err != nil {
		return fmt.Errorf("store: team usage: %w", err)
	}
	if !q.fits(u, 1, sz) {
		return quotaError(team, q, u, 1, sz)
	}
	return other
}

// admit (Postgres) takes team's quota lock for the rest of t, then checks
// that one more sandbox of size sz fits under q by what the team holds
// now. Every admission of the team, on every replica, holds the lock from
// its count to its commit, so none counts before another's sandbox is
// stored; a sandbox stopping meanwhile only frees room. A refusal names
// the usage that decided it (what refused does on SQLite).
func (s *Store) admit(ctx context.Context, t tx, team string, sz Size, q Quota) error {
	if err := s.dia.lock(ctx, t, lockTeamQuota, team); err != nil {
		return fmt.Errorf("store: quota lock of team %s: %w", team, err)
	}
	var u Usage
	if err := t.QueryRowContext(ctx, usageSQL, team).Scan(&u.Sandboxes, &u.MemoryMB, &u.CPU, &u.DiskMB); err != nil {
		return fmt.Errorf("store: team usage: %w", err)
	}
	if !q.fits(u, 1, sz) {
		if beforeRefusal != nil {
			beforeRefusal()
		}
		return quotaError(team, q, u, 1, sz)
	}
	return nil
}

// beforeRefusal, when set (tests), runs when a quota-checked write changed
// no row, before refused reads why (on Postgres: when admit refuses).
var beforeRefusal func()

// GetQuota returns team's own quota. Errors: errdefs.ErrNotFound when the
// team has none (the server's default applies).
func (s *Store) GetQuota(ctx context.Context, team string) (Quota, error) {
	var q Quota
	err := s.r.QueryRowContext(ctx, `SELECT max_sandboxes, max_memory_mb, max_cpu, max_snapshot_mb, max_rps, max_disk_mb FROM team_quotas WHERE team = ?`, team).Scan(&q.MaxSandboxes, &q.MaxMemoryMB, &q.MaxCPU, &q.MaxSnapshotMB, &q.MaxRPS, &q.MaxDiskMB)
	if errors.Is(err, sql.ErrNoRows) {
		return q, errdefs.NotFound("team %s has no quota of its own", team)
	}
	if err != nil {
		return q, fmt.Errorf("store: get quota: %w", err)
	}
	return q, nil
}

// PutQuota sets team's quota (replacing the server's default for it).
func (s *Store) PutQuota(ctx context.Context, team string, q Quota) error {
	if team == "" || q.MaxSandboxes < 0 || q.MaxMemoryMB < 0 || q.MaxCPU < 0 || q.MaxSnapshotMB < 0 || q.MaxRPS < 0 || q.MaxDiskMB < 0 {
		return errdefs.InvalidArgument("quota needs a team and limits of 0 (none) or more")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO team_quotas(team, max_sandboxes, max_memory_mb, max_cpu, max_snapshot_mb, max_rps, max_disk_mb, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(team) DO UPDATE SET max_sandboxes = excluded.max_sandboxes, max_memory_mb = excluded.max_memory_mb,
		max_cpu = excluded.max_cpu, max_snapshot_mb = excluded.max_snapshot_mb, max_rps = excluded.max_rps, max_disk_mb = excluded.max_disk_mb, updated_at = excluded.updated_at`,
		team, q.MaxSandboxes, q.MaxMemoryMB, q.MaxCPU, q.MaxSnapshotMB, q.MaxRPS, q.MaxDiskMB, toNanos(time.Now()))
	return classify(err, "quota of team "+team)
}

// DeleteQuota removes team's own quota (the server's default applies
// again). Errors: errdefs.ErrNotFound.
func (s *Store) DeleteQuota(ctx context.Context, team string) error {
	return s.deleteOne(ctx, "quota", errdefs.NotFound("team %s has no quota of its own", team), `DELETE FROM team_quotas WHERE team = ?`, team)
}
