package store

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`a = ? AND b IN (?,?)`, `a = $1 AND b IN ($2,$3)`},
		{`x = '?' AND y = ? AND "we?ird" = ?`, `x = '?' AND y = $1 AND "we?ird" = $2`},
		{`s = 'it''s ?' OR t = ?`, `s = 'it''s ?' OR t = $1`},
	} {
		if got := rebind(c.in); got != c.want {
			t.Errorf("rebind(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A transaction the server picks as a deadlock's victim runs again: two
// transactions that update two rows in opposite orders deadlock on
// Postgres, and both commit, the victim on a later attempt (its retry may
// take its first row before the winner does and deadlock once more: that
// is what the bound of maxRetries is for). SQLite's single writer never
// deadlocks: both commit on the first.
func TestDeadlockRetried(t *testing.T) { forBackends(t, testDeadlockRetried) }

func testDeadlockRetried(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	for _, id := range []string{"a", "b"} {
		if err := s.CreateSandbox(ctx, newSandbox(id, "t1", "running")); err != nil {
			t.Fatal(err)
		}
	}
	var attempts atomic.Int32
	var both sync.WaitGroup // each holds its first row before taking the second
	both.Add(2)
	var once [2]sync.Once
	move := func(i int, first, second string) error {
		return s.inTx(ctx, func(tx tx) error {
			attempts.Add(1)
			if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET reason = ? WHERE id = ?`, "first", first); err != nil {
				return err
			}
			if s.pg {
				once[i].Do(func() { both.Done(); both.Wait() })
			}
			_, err := tx.ExecContext(ctx, `UPDATE sandboxes SET reason = ? WHERE id = ?`, "second", second)
			return err
		})
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = move(0, "a", "b") })
	wg.Go(func() { errs[1] = move(1, "b", "a") })
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("transaction %d: %v", i, err)
		}
	}
	switch got := attempts.Load(); {
	case !s.pg && got != 2:
		t.Errorf("%d attempts on SQLite, want 2", got)
	case s.pg && got < 3:
		t.Errorf("%d attempts on Postgres, want the deadlock's victim again (3 or more)", got)
	}
}
