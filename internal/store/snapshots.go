package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Snapshot statuses.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed"
)

// Snapshot is the record of one snapshot; its content lives in the
// snapshot chunk store under the same id.
type Snapshot struct {
	ID             string
	SandboxID      string
	Team           string
	Kind           string // "checkpoint" or "files"
	Name           string
	Parent         string // the previous snapshot of the same sandbox ("" for the first)
	Template       string
	TemplateDigest string
	Automatic      bool
	Status         string
	Error          string
	BytesNew       int64
	BytesTotal     int64
	CreatedAt      time.Time
	// RetentionDays is its sandbox's retention_days when it was taken (0:
	// the server's policy), for when the sandbox's record is gone.
	RetentionDays int
	// CommandSeq is the process record (Process.Seq) of the command this
	// snapshot was taken after (snapshot_on_exec; 0: none), and Cause
	// that command's line as the timeline shows it (cut to MaxCauseBytes).
	CommandSeq int64
	Cause      string
}

// MaxCauseBytes bounds a snapshot's Cause.
const MaxCauseBytes = 200

const snapshotCols = `id, sandbox_id, team, kind, name, parent, template, template_digest, automatic, status, error, bytes_new, bytes_total, created_at, retention_days, command_seq, cause`

func scanSnapshot(sc scanner) (Snapshot, error) {
	var s Snapshot
	var auto int
	var created int64
	if err := sc.Scan(&s.ID, &s.SandboxID, &s.Team, &s.Kind, &s.Name, &s.Parent, &s.Template, &s.TemplateDigest, &auto, &s.Status, &s.Error, &s.BytesNew, &s.BytesTotal, &created, &s.RetentionDays, &s.CommandSeq, &s.Cause); err != nil {
		return Snapshot{}, err
	}
	s.Automatic = auto != 0
	s.CreatedAt = fromNanos(created)
	return s, nil
}

// CreateSnapshot records a new snapshot. Errors: errdefs.ErrConflict for a
// duplicate id.
func (s *Store) CreateSnapshot(ctx context.Context, sn Snapshot) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.ID, sn.SandboxID, sn.Team, sn.Kind, sn.Name, sn.Parent, sn.Template, sn.TemplateDigest, boolInt(sn.Automatic),
		sn.Status, sn.Error, sn.BytesNew, sn.BytesTotal, toNanos(sn.CreatedAt), sn.RetentionDays, sn.CommandSeq, sn.Cause)
	return classify(err, "snapshot "+sn.ID)
}

// FinishSnapshot sets a snapshot's final status and sizes.
func (s *Store) FinishSnapshot(ctx context.Context, id, status, errMsg string, bytesNew, bytesTotal int64) error {
	res, err := s.w.ExecContext(ctx, `UPDATE snapshots SET status = ?, error = ?, bytes_new = ?, bytes_total = ? WHERE id = ?`,
		status, errMsg, bytesNew, bytesTotal, id)
	if err != nil {
		return fmt.Errorf("store: finish snapshot: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("snapshot %s not found", id)
	}
	return nil
}

// GetSnapshot returns one snapshot. Errors: errdefs.ErrNotFound.
func (s *Store) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, errdefs.NotFound("snapshot %s not found", id)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("store: get snapshot: %w", err)
	}
	return sn, nil
}

// ListSnapshots returns the snapshots of a sandbox (sandboxID != "") or of
// every sandbox, oldest first, optionally only those with a status.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID, status string) ([]Snapshot, error) {
	return s.listSnapshots(ctx, "sandbox_id", sandboxID, status)
}

// TeamSnapshots returns the snapshots team owns, oldest first, optionally
// only those with a status.
func (s *Store) TeamSnapshots(ctx context.Context, team, status string) ([]Snapshot, error) {
	if team == "" {
		return nil, nil
	}
	return s.listSnapshots(ctx, "team", team, status)
}

// listSnapshots lists snapshots whose column col is value (any when value
// is empty) and, if status is set, have that status.
func (s *Store) listSnapshots(ctx context.Context, col, value, status string) ([]Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE 1=1`
	var args []any
	if value != "" {
		q += ` AND ` + col + ` = ?`
		args = append(args, value)
	}
	if status != "" {
		q += ` AND status = ?`
		args = append(args, status)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot record; snapshots whose parent it was
// get its parent instead, so a timeline never names a deleted snapshot.
// Errors: errdefs.ErrNotFound.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx tx) error {
		// Two replicas deleting neighbours of one timeline at once would
		// each re-parent by what the other has not committed yet.
		if err := s.dia.lock(ctx, tx, lockSnapshots, ""); err != nil {
			return fmt.Errorf("store: delete snapshot: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET parent = (SELECT parent FROM snapshots WHERE id = ?)
			WHERE parent = ? AND EXISTS (SELECT 1 FROM snapshots WHERE id = ?)`, id, id, id); err != nil {
			return fmt.Errorf("store: delete snapshot: %w", err)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("store: delete snapshot: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("snapshot %s not found", id)
		}
		return nil
	})
}
