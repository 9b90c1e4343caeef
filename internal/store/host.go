package store

import (
	"context"
	"fmt"

	"github.com/spacesandbox/space/internal/errdefs"
)

// HoldSandboxHost claims the database for the calling server as the one
// that runs sandboxes on it, until release is called (or the process
// ends). Today every `space serve` runs its sandboxes in process, and its
// start-up recovery takes every live record as its own: a second server
// on the same database would destroy the first's sandboxes. Until records
// name the node that owns them (issue 29's nodes), a Postgres database
// therefore has one sandbox-running server at a time; a second is
// refused with errdefs.ErrConflict. On SQLite it is a no-op: the data
// directory's lock already keeps a second server off the file.
//
// The claim is a session advisory lock on a connection of its own, held
// open: if that connection ends (the database restarted), the claim
// lapses with it.
func (s *Store) HoldSandboxHost(ctx context.Context) (release func(), err error) {
	if !s.pg {
		return func() {}, nil
	}
	conn, err := s.w.DB.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, 0)`, lockSandboxHost).Scan(&got); err != nil {
		conn.Close()
		return nil, fmt.Errorf("store: sandbox host lock: %w", err)
	}
	if !got {
		conn.Close()
		return nil, errdefs.Conflict("another space server runs sandboxes on this database: until sandboxes are owned by nodes, one server per database runs them")
	}
	return func() {
		conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1, 0)`, lockSandboxHost)
		conn.Close()
	}, nil
}
