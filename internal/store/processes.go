package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Process is a process started in a sandbox. Records go away with their
// sandbox.
type Process struct {
	Seq        int64 // the record's order among all processes (set by the store)
	SandboxID  string
	PID        int
	Cmd        []string
	Tag        string
	Background bool
	StartedAt  time.Time
	ExitCode   *int       // nil while running
	ExitedAt   *time.Time // nil while running
}

// MaxProcessesPerSandbox is how many process records a sandbox keeps: the
// transaction that records a start deletes the oldest beyond it. Every
// exec adds a record, and records went only with their sandbox's (24 h
// after it stopped): a sandbox that ran commands in a loop for days grew
// the table without bound.
const MaxProcessesPerSandbox = 1000

// MaxCmdBytes bounds the command a process record keeps (its arguments'
// bytes, and one per argument): a command may take up to 1 MiB, and each
// was stored whole, and held whole in the process log's backlog until
// written. A longer one is cut, and ends in CmdTruncated.
const MaxCmdBytes = 4096

// CmdTruncated ends the last argument of a command cut to MaxCmdBytes.
const CmdTruncated = "…(truncated)"

// CapCmd returns cmd, or, when it is longer than MaxCmdBytes, its
// arguments up to that size, the last one cut (on a character boundary)
// and marked with CmdTruncated.
func CapCmd(cmd []string) []string {
	n := 0
	for _, a := range cmd {
		n += len(a) + 1
	}
	if n <= MaxCmdBytes {
		return cmd
	}
	budget := MaxCmdBytes - len(CmdTruncated) - 1
	var out []string
	used := 0
	for _, a := range cmd {
		if used+len(a)+1 <= budget {
			out = append(out, a)
			used += len(a) + 1
			continue
		}
		room := max(budget-used-1, 0) // < len(a)
		for room > 0 && !utf8.RuneStart(a[room]) {
			room--
		}
		return append(out, a[:room]+CmdTruncated)
	}
	return out // not reached: some argument crosses the budget
}

// trimProcessesSQL deletes the records of a sandbox older than its
// newest MaxProcessesPerSandbox (arguments: the sandbox twice, the
// limit). Both the walk back to the limit and the delete are ranges of
// the index processes_sandbox_seq; nothing older than the limit is read.
const trimProcessesSQL = `DELETE FROM processes WHERE sandbox_id = ? AND seq <= (
	SELECT seq FROM processes WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`

// RecordProcess stores a started process. A PID may be recorded again once
// its earlier process has exited (PIDs are reused in long-lived sandboxes).
// StartedAt defaults to now. Errors: errdefs.ErrNotFound if the sandbox
// does not exist.
func (s *Store) RecordProcess(ctx context.Context, p Process) error {
	if p.SandboxID == "" {
		return errdefs.InvalidArgument("process needs a sandbox id")
	}
	if p.StartedAt.IsZero() {
		p.StartedAt = time.Now()
	}
	cmd, err := json.Marshal(CapCmd(p.Cmd))
	if err != nil {
		return fmt.Errorf("store: encode cmd: %w", err)
	}
	var code sql.NullInt64
	if p.ExitCode != nil {
		code = sql.NullInt64{Int64: int64(*p.ExitCode), Valid: true}
	}
	return s.inTx(ctx, func(t tx) error {
		_, err := t.ExecContext(ctx, `INSERT INTO processes(sandbox_id, pid, cmd, tag, background, started_at, exit_code, exited_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			p.SandboxID, p.PID, string(cmd), p.Tag, boolInt(p.Background), toNanos(p.StartedAt), code, toNullNanos(p.ExitedAt))
		if err != nil {
			return classify(err, fmt.Sprintf("process %d of sandbox %s", p.PID, p.SandboxID))
		}
		if _, err := t.ExecContext(ctx, trimProcessesSQL, p.SandboxID, p.SandboxID, MaxProcessesPerSandbox); err != nil {
			return fmt.Errorf("store: trim processes: %w", err)
		}
		return nil
	})
}

// FinishProcess records the exit of the running process pid of sandboxID
// (the latest record of that PID without an exit). exitedAt defaults to
// now. Errors: errdefs.ErrNotFound if no such running process is recorded.
func (s *Store) FinishProcess(ctx context.Context, sandboxID string, pid, exitCode int, exitedAt time.Time) error {
	if exitedAt.IsZero() {
		exitedAt = time.Now()
	}
	res, err := s.w.ExecContext(ctx, `UPDATE processes SET exit_code = ?, exited_at = ?
		WHERE seq = (SELECT MAX(seq) FROM processes WHERE sandbox_id = ? AND pid = ? AND exited_at IS NULL)`,
		exitCode, toNanos(exitedAt), sandboxID, pid)
	if err != nil {
		return fmt.Errorf("store: finish process: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("no running process %d in sandbox %s", pid, sandboxID)
	}
	return nil
}

// ListProcesses returns the processes of sandboxID in the order they were
// recorded (empty, not an error, for an unknown sandbox).
func (s *Store) ListProcesses(ctx context.Context, sandboxID string) ([]Process, error) {
	out, _, err := s.ProcessPage(ctx, sandboxID, 0, -1)
	return out, err
}

// ProcessPage returns up to limit (< 0: all) processes of sandboxID
// recorded after the one of sequence number after (0: from the first), in
// the order they were recorded, and the sequence number to continue after
// when more may follow (0 when these are the last).
func (s *Store) ProcessPage(ctx context.Context, sandboxID string, after int64, limit int) ([]Process, int64, error) {
	q := math.MaxInt64 // all (Postgres refuses SQLite's LIMIT -1)
	if limit >= 0 {
		q = limit + 1 // one more tells whether a next page exists
	}
	out, err := s.queryProcesses(ctx, `SELECT `+processCols+`
		FROM processes WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`, sandboxID, after, q)
	if err != nil {
		return nil, 0, err
	}
	var next int64
	if limit >= 0 && len(out) > limit {
		out = out[:limit]
		next = out[len(out)-1].Seq
	}
	return out, next, nil
}

const processCols = `seq, sandbox_id, pid, cmd, tag, background, started_at, exit_code, exited_at`

// GetProcess returns the process record seq of sandboxID. Errors:
// errdefs.ErrNotFound (no such record, or it is another sandbox's).
func (s *Store) GetProcess(ctx context.Context, sandboxID string, seq int64) (Process, error) {
	out, err := s.queryProcesses(ctx, `SELECT `+processCols+` FROM processes WHERE sandbox_id = ? AND seq = ?`, sandboxID, seq)
	if err != nil {
		return Process{}, err
	}
	if len(out) == 0 {
		return Process{}, errdefs.NotFound("no command %d in sandbox %s", seq, sandboxID)
	}
	return out[0], nil
}

// LatestProcess returns the newest record of PID pid in sandboxID (a PID
// is recorded again once reused). Errors: errdefs.ErrNotFound.
func (s *Store) LatestProcess(ctx context.Context, sandboxID string, pid int) (Process, error) {
	out, err := s.queryProcesses(ctx, `SELECT `+processCols+` FROM processes WHERE sandbox_id = ? AND pid = ? ORDER BY seq DESC LIMIT 1`, sandboxID, pid)
	if err != nil {
		return Process{}, err
	}
	if len(out) == 0 {
		return Process{}, errdefs.NotFound("no process %d in sandbox %s", pid, sandboxID)
	}
	return out[0], nil
}

func (s *Store) queryProcesses(ctx context.Context, q string, args ...any) ([]Process, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list processes: %w", err)
	}
	defer rows.Close()
	var out []Process
	for rows.Next() {
		var p Process
		var cmd string
		var bg int
		var started int64
		var code, exited sql.NullInt64
		if err := rows.Scan(&p.Seq, &p.SandboxID, &p.PID, &cmd, &p.Tag, &bg, &started, &code, &exited); err != nil {
			return nil, fmt.Errorf("store: list processes: %w", err)
		}
		if err := json.Unmarshal([]byte(cmd), &p.Cmd); err != nil {
			return nil, fmt.Errorf("store: decode cmd: %w", err)
		}
		p.Background = bg != 0
		p.StartedAt = fromNanos(started)
		if code.Valid {
			c := int(code.Int64)
			p.ExitCode = &c
		}
		p.ExitedAt = fromNullNanos(exited)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list processes: %w", err)
	}
	return out, nil
}

// ProcessOp is one entry of a process log batch: a start (Start set) or an
// exit (Exit set).
type ProcessOp struct {
	Start *Process
	Exit  *ProcessExit
}

// ProcessExit is the exit of the latest running record of PID.
type ProcessExit struct {
	SandboxID string
	PID       int
	ExitCode  int
	ExitedAt  time.Time
}

// ApplyProcessOps applies ops in order in one transaction. Ops whose
// sandbox is gone (a start) or whose process is unknown (an exit) are
// skipped: the batch is a log, and one stale entry must not lose the rest.
// Each sandbox a start was recorded for then keeps its newest
// MaxProcessesPerSandbox records (once per batch: the trim walks that many
// index entries).
func (s *Store) ApplyProcessOps(ctx context.Context, ops []ProcessOp) error {
	return s.inTx(ctx, func(tx tx) error {
		var started []string // sandboxes to trim, each once
		for _, op := range ops {
			switch {
			case op.Start != nil:
				p := op.Start
				if !slices.Contains(started, p.SandboxID) {
					started = append(started, p.SandboxID)
				}
				cmd, err := json.Marshal(CapCmd(p.Cmd))
				if err != nil {
					return fmt.Errorf("store: encode cmd: %w", err)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO processes(sandbox_id, pid, cmd, tag, background, started_at)
					SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`,
					p.SandboxID, p.PID, string(cmd), p.Tag, boolInt(p.Background), toNanos(p.StartedAt), p.SandboxID); err != nil {
					return fmt.Errorf("store: record process: %w", err)
				}
			case op.Exit != nil:
				e := op.Exit
				if _, err := tx.ExecContext(ctx, `UPDATE processes SET exit_code = ?, exited_at = ?
					WHERE seq = (SELECT MAX(seq) FROM processes WHERE sandbox_id = ? AND pid = ? AND exited_at IS NULL)`,
					e.ExitCode, toNanos(e.ExitedAt), e.SandboxID, e.PID); err != nil {
					return fmt.Errorf("store: finish process: %w", err)
				}
			}
		}
		for _, id := range started {
			if _, err := tx.ExecContext(ctx, trimProcessesSQL, id, id, MaxProcessesPerSandbox); err != nil {
				return fmt.Errorf("store: trim processes: %w", err)
			}
		}
		return nil
	})
}
