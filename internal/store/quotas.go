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
	MaxSandboxes  int // sandboxes holding host resources (creating, running, paused, stopping)
	MaxMemoryMB   int // the sum of their memory
	MaxSnapshotMB int // distinct data its snapshots hold (checked by the service before each snapshot)
}

// SandboxesUnlimited reports whether q limits neither the number of
// sandboxes nor their memory (what a create checks).
func (q Quota) SandboxesUnlimited() bool { return q.MaxSandboxes <= 0 && q.MaxMemoryMB <= 0 }

// Usage is what a team holds now, counted as a Quota counts.
type Usage struct {
	Sandboxes int
	MemoryMB  int
}

// liveStates are the states that hold host resources. A paused sandbox is
// frozen in memory; pooled sandboxes belong to no team. The partial index
// sandboxes_live_team names the same list.
const liveStates = `('creating', 'running', 'paused', 'stopping')`

// usageSQL counts a team's live sandboxes and their memory.
const usageSQL = `SELECT COUNT(*), COALESCE(SUM(memory_mb), 0) FROM sandboxes WHERE team = ? AND state IN ` + liveStates

// withinSQL is a condition true while a team (first argument) may take one
// more sandbox of the given memory (second) under a quota (max sandboxes,
// then max memory; 0 or less is no limit).
const withinSQL = `(SELECT (? <= 0 OR n < ?) AND (? <= 0 OR mem + ? <= ?) FROM (
	SELECT COUNT(*) AS n, COALESCE(SUM(memory_mb), 0) AS mem FROM sandboxes WHERE team = ? AND state IN ` + liveStates + `))`

func withinArgs(team string, memoryMB int, q Quota) []any {
	return []any{q.MaxSandboxes, q.MaxSandboxes, q.MaxMemoryMB, memoryMB, q.MaxMemoryMB, team}
}

// TeamUsage returns what team holds now.
func (s *Store) TeamUsage(ctx context.Context, team string) (Usage, error) {
	var u Usage
	if err := s.r.QueryRowContext(ctx, usageSQL, team).Scan(&u.Sandboxes, &u.MemoryMB); err != nil {
		return u, fmt.Errorf("store: team usage: %w", err)
	}
	return u, nil
}

// fits reports whether a team holding u may take n more sandboxes of
// memoryMB each under q.
func (q Quota) fits(u Usage, n, memoryMB int) bool {
	return (q.MaxSandboxes <= 0 || u.Sandboxes+n <= q.MaxSandboxes) &&
		(q.MaxMemoryMB <= 0 || u.MemoryMB+n*memoryMB <= q.MaxMemoryMB)
}

// quotaError is the error of a create the team's quota refuses; it says
// which limit and what the team holds.
func quotaError(team string, q Quota, u Usage, n, memoryMB int) error {
	if q.MaxSandboxes > 0 && u.Sandboxes+n > q.MaxSandboxes {
		return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s has %d of its %d sandboxes (running or paused); %d more do not fit", team, u.Sandboxes, q.MaxSandboxes, n)
	}
	return errdefs.Newf(errdefs.ErrQuotaExceeded, "team %s uses %d of its %d MiB of sandbox memory; %d MiB more does not fit", team, u.MemoryMB, q.MaxMemoryMB, n*memoryMB)
}

// CheckQuota returns an ErrQuotaExceeded error if team cannot take n more
// sandboxes of memoryMB each now. It is advisory (a create checked here
// may still lose a race): CreateSandboxWithin and ClaimSandboxWithin
// decide.
func (s *Store) CheckQuota(ctx context.Context, team string, n, memoryMB int, q Quota) error {
	if q.SandboxesUnlimited() {
		return nil
	}
	u, err := s.TeamUsage(ctx, team)
	if err != nil {
		return err
	}
	if !q.fits(u, n, memoryMB) {
		return quotaError(team, q, u, n, memoryMB)
	}
	return nil
}

// refused explains a quota-checked write that changed no row: the quota,
// or (when the quota has room, so the row was the reason) other.
func (s *Store) refused(ctx context.Context, team string, memoryMB int, q Quota, other error) error {
	u, err := s.TeamUsage(ctx, team)
	if err != nil {
		return err
	}
	if !q.fits(u, 1, memoryMB) {
		return quotaError(team, q, u, 1, memoryMB)
	}
	return other
}

// GetQuota returns team's own quota. Errors: errdefs.ErrNotFound when the
// team has none (the server's default applies).
func (s *Store) GetQuota(ctx context.Context, team string) (Quota, error) {
	var q Quota
	err := s.r.QueryRowContext(ctx, `SELECT max_sandboxes, max_memory_mb, max_snapshot_mb FROM team_quotas WHERE team = ?`, team).Scan(&q.MaxSandboxes, &q.MaxMemoryMB, &q.MaxSnapshotMB)
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
	if team == "" || q.MaxSandboxes < 0 || q.MaxMemoryMB < 0 || q.MaxSnapshotMB < 0 {
		return errdefs.InvalidArgument("quota needs a team and limits of 0 (none) or more")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO team_quotas(team, max_sandboxes, max_memory_mb, max_snapshot_mb, updated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT(team) DO UPDATE SET max_sandboxes = excluded.max_sandboxes, max_memory_mb = excluded.max_memory_mb,
		max_snapshot_mb = excluded.max_snapshot_mb, updated_at = excluded.updated_at`,
		team, q.MaxSandboxes, q.MaxMemoryMB, q.MaxSnapshotMB, toNanos(time.Now()))
	return classify(err, "quota of team "+team)
}

// DeleteQuota removes team's own quota (the server's default applies
// again). Errors: errdefs.ErrNotFound.
func (s *Store) DeleteQuota(ctx context.Context, team string) error {
	return s.deleteOne(ctx, "quota", errdefs.NotFound("team %s has no quota of its own", team), `DELETE FROM team_quotas WHERE team = ?`, team)
}
