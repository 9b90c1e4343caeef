package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// SetSandboxTimeout sets sandbox id's timeout and its new expiry if it is
// in one of states. Errors: errdefs.ErrNotFound, errdefs.ErrConflict (in
// another state).
func (s *Store) SetSandboxTimeout(ctx context.Context, id string, states []string, timeoutS int, expiresAt time.Time) error {
	args := []any{timeoutS, toNanos(expiresAt), toNanos(time.Now()), id}
	for _, st := range states {
		args = append(args, st)
	}
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET timeout_s = ?, expires_at = ?, updated_at = ?
		WHERE id = ? AND state IN (`+placeholders(len(states))+`)`, args...)
	if err != nil {
		return fmt.Errorf("store: set timeout of %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// Gone, or no longer running or paused (the reaper took it for
		// its timeout meanwhile): a new timeout would not apply.
		var state string
		if err := s.r.QueryRowContext(ctx, `SELECT state FROM sandboxes WHERE id = ?`, id).Scan(&state); err != nil {
			return errdefs.NotFound("sandbox %s not found", id)
		}
		return errdefs.Conflict("sandbox is %s", state)
	}
	return nil
}

// ExpireSandbox moves a sandbox whose expiry has passed at now from one of
// states to to, with reason. Errors: errdefs.ErrConflict when it is in
// another state or its expiry is not past (a timeout set since the
// reaper listed it), errdefs.ErrNotFound.
func (s *Store) ExpireSandbox(ctx context.Context, id string, states []string, now time.Time, to, reason string) error {
	args := []any{to, reason, toNanos(time.Now()), id, toNanos(now)}
	for _, st := range states {
		args = append(args, st)
	}
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ?, updated_at = ?
		WHERE id = ? AND expires_at > 0 AND expires_at <= ? AND state IN (`+placeholders(len(states))+`)`, args...)
	if err != nil {
		return fmt.Errorf("store: expire sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Conflict("sandbox %s is not expired in state %v", id, states)
	}
	return nil
}

// DeleteStoppedBefore forgets sandboxes that stopped before t and returns
// their ids.
func (s *Store) DeleteStoppedBefore(ctx context.Context, t time.Time) ([]string, error) {
	rows, err := s.w.QueryContext(ctx, `DELETE FROM sandboxes WHERE state = ? AND stopped_at IS NOT NULL AND stopped_at < ? RETURNING id`,
		StateStopped, toNanos(t))
	if err != nil {
		return nil, fmt.Errorf("store: delete stopped sandboxes: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: delete stopped sandboxes: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: delete stopped sandboxes: %w", err)
	}
	return ids, nil
}

// CountSandboxesByState returns how many sandboxes are in each state.
func (s *Store) CountSandboxesByState(ctx context.Context) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT state, COUNT(*) FROM sandboxes GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("store: count sandboxes: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("store: count sandboxes: %w", err)
		}
		out[st] = n
	}
	return out, rows.Err()
}

// ClaimSandbox hands a pooled sandbox to its owner in one compare-and-set:
// owner fields, timeout and state pooled → running. It fails with
// ErrConflict when the sandbox is not pooled (already claimed, or gone).
func (s *Store) ClaimSandbox(ctx context.Context, sb Sandbox) error {
	return s.ClaimSandboxWithin(ctx, sb, Quota{})
}

// ClaimSandboxWithin is ClaimSandbox under the new owner's quota q, checked
// in the same statement. Errors also errdefs.ErrQuotaExceeded.
func (s *Store) ClaimSandboxWithin(ctx context.Context, sb Sandbox, q Quota) error {
	env, err := encodeMap(sb.Env)
	if err != nil {
		return err
	}
	md, err := encodeMap(sb.Metadata)
	if err != nil {
		return err
	}
	query := `UPDATE sandboxes SET team = ?, env = ?, metadata = ?, timeout_s = ?, on_timeout = ?,
		created_at = ?, updated_at = ?, expires_at = ?, snapshot_interval_s = ?, retention_days = ?, public_ports = ?, auto_resume = ?, snapshot_on_exec = ?, state = 'running'
		WHERE id = ? AND state = 'pooled'`
	args := []any{sb.Team, env, md, sb.TimeoutS, sb.OnTimeout, toNanos(sb.CreatedAt), toNanos(sb.UpdatedAt), toNanos(sb.ExpiresAt),
		sb.SnapshotIntervalS, sb.RetentionDays, boolInt(sb.PublicPorts), boolInt(sb.AutoResume), boolInt(sb.SnapshotOnExec), sb.ID}
	if s.pg {
		return s.claimPG(ctx, sb, q, query, args)
	}
	if !q.SandboxesUnlimited() {
		query += ` AND ` + withinSQL
		args = append(args, withinArgs(sb.Team, SizeOf(sb), q)...)
	}
	// Claims come in bursts (a burst of warm creates): they share
	// transactions. A claim that changed no row is explained in its
	// transaction, by what its statement saw.
	_, err = s.grouped.execThen(func(ctx context.Context, t tx, res sql.Result) error {
		if n, _ := res.RowsAffected(); n > 0 {
			return nil
		}
		notPooled := errdefs.Conflict("sandbox %s is not pooled", sb.ID)
		if q.SandboxesUnlimited() {
			return notPooled
		}
		return refused(ctx, t, sb.Team, SizeOf(sb), q, notPooled)
	}, query, args...)
	if err != nil && !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrQuotaExceeded) {
		return fmt.Errorf("store: claim sandbox: %w", err)
	}
	return err
}

// claimPG is ClaimSandboxWithin on Postgres. Claims are not grouped there
// (each runs on a connection of its own, beside the others); one under a
// quota takes its team's quota lock first, so that the count it admits by
// holds until it commits, across replicas.
func (s *Store) claimPG(ctx context.Context, sb Sandbox, q Quota, query string, args []any) error {
	return s.inTx(ctx, func(t tx) error {
		if !q.SandboxesUnlimited() {
			if err := s.admit(ctx, t, sb.Team, SizeOf(sb), q); err != nil {
				return err
			}
		}
		res, err := t.ExecContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("store: claim sandbox: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.Conflict("sandbox %s is not pooled", sb.ID)
		}
		return nil
	})
}
