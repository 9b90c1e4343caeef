package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// StateStopped is the one sandbox state the store knows by name: entering
// it records StoppedAt (once), and ListExpired skips stopped sandboxes. The
// rest of the state machine belongs to the sandbox service.
const StateStopped = "stopped"

// Sandbox is the durable record of a sandbox.
type Sandbox struct {
	ID             string
	Team           string
	Template       string
	TemplateDigest string
	Driver         string
	State          string
	Reason         string // why the sandbox entered State (e.g. "timeout")
	Handle         []byte // the driver's opaque handle (JSON)
	Env            map[string]string
	Metadata       map[string]string
	CPU            int
	MemoryMB       int
	// DiskMB is the most host disk the sandbox's writable layer may fill
	// (its reservation against the team's MaxDiskMB).
	DiskMB    int
	TimeoutS  int
	OnTimeout string
	CreatedAt time.Time
	UpdatedAt time.Time
	ExpiresAt time.Time // zero: never
	StoppedAt *time.Time
	// Per-sandbox snapshot history settings (0: the server's).
	SnapshotIntervalS int // seconds between automatic files snapshots; -1: none
	RetentionDays     int // how long this sandbox's history is kept
	// PublicPorts lets anyone who knows a port's <port>-<id>.<domain> name
	// on the E2B listener reach it without a token (E2B's
	// allowPublicTraffic); off unless asked for at create.
	PublicPorts bool
	// AutoResume: while paused, a request to its processes, files or
	// ports resumes it (E2B's autoResume); off unless asked for.
	AutoResume bool
	// SnapshotOnExec: a files snapshot after every command that changed
	// files, naming the command.
	SnapshotOnExec bool
}

// SandboxFilter selects sandboxes for ListSandboxes. Empty fields match
// everything.
type SandboxFilter struct {
	Team     string            // only this team's sandboxes ("" = every team)
	States   []string          // only sandboxes in one of these states
	Metadata map[string]string // only sandboxes whose metadata has every pair
	Limit    int               // page size; 0 means DefaultListLimit, capped at MaxListLimit
	After    string            // cursor returned by the previous page
	// Templates, when set, keeps only sandboxes of one of these templates.
	Templates []string
	// CreatedFrom, when set, keeps only sandboxes created at or after it.
	CreatedFrom time.Time
	// Newest lists the newest first (E2B's order); the default is oldest
	// first. A cursor continues the order of the page it came from.
	Newest bool
}

// Page sizes of ListSandboxes.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

const sandboxCols = `id, team, template, template_digest, driver, state, reason, handle, env, metadata,
	cpu, memory_mb, timeout_s, on_timeout, created_at, updated_at, expires_at, stopped_at,
	snapshot_interval_s, retention_days, public_ports, auto_resume, snapshot_on_exec, disk_mb`

func scanSandbox(sc scanner) (Sandbox, error) {
	var sb Sandbox
	var env, md string
	var created, updated, expires int64
	var stopped sql.NullInt64
	var public, autoResume, onExec int
	if err := sc.Scan(&sb.ID, &sb.Team, &sb.Template, &sb.TemplateDigest, &sb.Driver, &sb.State, &sb.Reason,
		&sb.Handle, &env, &md, &sb.CPU, &sb.MemoryMB, &sb.TimeoutS, &sb.OnTimeout,
		&created, &updated, &expires, &stopped, &sb.SnapshotIntervalS, &sb.RetentionDays, &public, &autoResume, &onExec, &sb.DiskMB); err != nil {
		return Sandbox{}, err
	}
	sb.PublicPorts, sb.AutoResume, sb.SnapshotOnExec = public != 0, autoResume != 0, onExec != 0
	var err error
	if sb.Env, err = decodeMap(env); err != nil {
		return Sandbox{}, err
	}
	if sb.Metadata, err = decodeMap(md); err != nil {
		return Sandbox{}, err
	}
	sb.CreatedAt = fromNanos(created)
	sb.UpdatedAt = fromNanos(updated)
	sb.ExpiresAt = fromNanos(expires)
	sb.StoppedAt = fromNullNanos(stopped)
	return sb, nil
}

// CreateSandbox stores sb. CreatedAt and UpdatedAt default to now.
// Errors: errdefs.ErrInvalidArgument for a missing id, team or state,
// errdefs.ErrConflict if the id exists.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	return s.CreateSandboxWithin(ctx, sb, Quota{})
}

// CreateSandboxWithin is CreateSandbox under the team's quota q, checked
// and stored in one statement (the single writer serializes them, so
// concurrent creates cannot overshoot). Errors also
// errdefs.ErrQuotaExceeded.
func (s *Store) CreateSandboxWithin(ctx context.Context, sb Sandbox, q Quota) error {
	if sb.ID == "" || sb.Team == "" || sb.State == "" {
		return errdefs.InvalidArgument("sandbox needs an id, a team and a state")
	}
	now := time.Now()
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now
	}
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = sb.CreatedAt
	}
	env, err := encodeMap(sb.Env)
	if err != nil {
		return err
	}
	md, err := encodeMap(sb.Metadata)
	if err != nil {
		return err
	}
	args := []any{sb.ID, sb.Team, sb.Template, sb.TemplateDigest, sb.Driver, sb.State, sb.Reason, sb.Handle, env, md,
		sb.CPU, sb.MemoryMB, sb.TimeoutS, sb.OnTimeout,
		toNanos(sb.CreatedAt), toNanos(sb.UpdatedAt), toNanos(sb.ExpiresAt), toNullNanos(sb.StoppedAt),
		sb.SnapshotIntervalS, sb.RetentionDays, boolInt(sb.PublicPorts), boolInt(sb.AutoResume), boolInt(sb.SnapshotOnExec), sb.DiskMB}
	const values = `?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?`
	if q.SandboxesUnlimited() {
		_, err = s.w.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) VALUES (`+values+`)`, args...)
		return classify(err, "sandbox "+sb.ID)
	}
	if s.pg {
		// Under the team's quota lock: the count and the insert cannot
		// interleave with another replica's admission.
		return s.inTx(ctx, func(t tx) error {
			if err := s.admit(ctx, t, sb.Team, SizeOf(sb), q); err != nil {
				return err
			}
			_, err := t.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) VALUES (`+values+`)`, args...)
			return classify(err, "sandbox "+sb.ID)
		})
	}
	// One transaction: a refusal is explained by what the insert saw.
	return s.inTx(ctx, func(t tx) error {
		res, err := t.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) SELECT `+values+` WHERE `+withinSQL,
			append(args, withinArgs(sb.Team, SizeOf(sb), q)...)...)
		if err != nil {
			return classify(err, "sandbox "+sb.ID)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return refused(ctx, t, sb.Team, SizeOf(sb), q, fmt.Errorf("store: sandbox %s not stored", sb.ID))
		}
		return nil
	})
}

// GetSandbox returns the sandbox id. Errors: errdefs.ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	return getSandbox(ctx, s.r, id)
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getSandbox(ctx context.Context, q queryer, id string) (Sandbox, error) {
	sb, err := scanSandbox(q.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("store: get sandbox: %w", err)
	}
	return sb, nil
}

// ListSandboxes returns one page of the sandboxes matching f, oldest first,
// and the cursor of the next page ("" when this is the last one).
// Errors: errdefs.ErrInvalidArgument for a malformed cursor.
func (s *Store) ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)

	var where []string
	var args []any
	if f.Team != "" {
		where = append(where, "team = ?")
		args = append(args, f.Team)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for k, v := range f.Metadata {
		where = append(where, s.dia.metadataMatch())
		args = append(args, k, v)
	}
	if len(f.Templates) > 0 {
		where = append(where, "template IN ("+placeholders(len(f.Templates))+")")
		for _, t := range f.Templates {
			args = append(args, t)
		}
	}
	if !f.CreatedFrom.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, toNanos(f.CreatedFrom))
	}
	cmp, order := ">", " ORDER BY created_at, id LIMIT ?"
	if f.Newest {
		cmp, order = "<", " ORDER BY created_at DESC, id DESC LIMIT ?"
	}
	if f.After != "" {
		created, id, err := decodeCursor(f.After)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at "+cmp+" ? OR (created_at = ? AND id "+cmp+" ?))")
		args = append(args, created, created, id)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += order
	args = append(args, limit+1) // one more tells whether there is a next page

	// Built from the filter: unprepared, never cached.
	rows, err := s.r.queryBuilt(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", fmt.Errorf("store: list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[len(out)-1]
		next = encodeCursor(toNanos(last.CreatedAt), last.ID)
	}
	return out, next, nil
}

// UpdateSandboxState moves sandbox id to state to, recording reason, if its
// current state is one of fromStates (any state if fromStates is empty).
// It is a compare-and-set: errdefs.ErrConflict, with a message naming the
// current state ("sandbox is paused"), when the state is not one of
// fromStates; errdefs.ErrNotFound when the sandbox does not exist. Entering
// StateStopped records StoppedAt.
func (s *Store) UpdateSandboxState(ctx context.Context, id string, fromStates []string, to, reason string) error {
	if to == "" {
		return errdefs.InvalidArgument("empty target state")
	}
	return s.inTx(ctx, func(tx tx) error {
		var cur string
		err := tx.QueryRowContext(ctx, `SELECT state FROM sandboxes WHERE id = ?`+s.dia.forUpdate(), id).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("sandbox %s not found", id)
		}
		if err != nil {
			return fmt.Errorf("store: update sandbox state: %w", err)
		}
		if len(fromStates) > 0 && !slices.Contains(fromStates, cur) {
			return errdefs.Conflict("sandbox is %s", cur)
		}
		now := toNanos(time.Now())
		var stopped any // NULL: leave stopped_at as it is
		if to == StateStopped {
			stopped = now
		}
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ?, updated_at = ?,
			stopped_at = COALESCE(stopped_at, ?) WHERE id = ?`, to, reason, now, stopped, id)
		if err != nil {
			return fmt.Errorf("store: update sandbox state: %w", err)
		}
		return nil
	})
}

// SetSandboxHandle replaces the driver handle of sandbox id.
// Errors: errdefs.ErrNotFound.
func (s *Store) SetSandboxHandle(ctx context.Context, id string, handle []byte) error {
	return s.updateSandbox(ctx, id, `handle = ?`, handle)
}

// SetSandboxExpiry sets when sandbox id times out (zero: never).
// Errors: errdefs.ErrNotFound.
func (s *Store) SetSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error {
	return s.updateSandbox(ctx, id, `expires_at = ?`, toNanos(expiresAt))
}

// ClearExpiryIfPaused clears sandbox id's expiry when it is paused (a
// sandbox that times out into a pause never expires while paused), and
// leaves a sandbox that was resumed meanwhile with the new period Resume
// gave it.
func (s *Store) ClearExpiryIfPaused(ctx context.Context, id string) error {
	_, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET expires_at = 0, updated_at = ? WHERE id = ? AND state = ?`,
		toNanos(time.Now()), id, "paused")
	if err != nil {
		return fmt.Errorf("store: clear expiry of %s: %w", id, err)
	}
	return nil
}

func (s *Store) updateSandbox(ctx context.Context, id, set string, arg any) error {
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET `+set+`, updated_at = ? WHERE id = ?`,
		arg, toNanos(time.Now()), id)
	if err != nil {
		return fmt.Errorf("store: update sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("sandbox %s not found", id)
	}
	return nil
}

// DeleteSandbox removes sandbox id and its process records.
// Errors: errdefs.ErrNotFound.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.deleteOne(ctx, "sandbox", errdefs.NotFound("sandbox %s not found", id), `DELETE FROM sandboxes WHERE id = ?`, id)
}

// ListExpired returns the sandboxes, of every team, whose expiry is set and
// not after now and that have not stopped, soonest expiry first.
func (s *Store) ListExpired(ctx context.Context, now time.Time) ([]Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE expires_at > 0 AND stopped_at IS NULL AND expires_at <= ? AND state <> ?
		ORDER BY expires_at, id`, toNanos(now), StateStopped)
	if err != nil {
		return nil, fmt.Errorf("store: list expired: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list expired: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list expired: %w", err)
	}
	return out, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// Cursors are opaque to callers: base64url of "<created_at nanos>:<id>".

func encodeCursor(created int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(created, 10) + ":" + id))
}

func decodeCursor(c string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", errdefs.InvalidArgument("malformed cursor")
	}
	ts, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || id == "" {
		return 0, "", errdefs.InvalidArgument("malformed cursor")
	}
	return n, id, nil
}
