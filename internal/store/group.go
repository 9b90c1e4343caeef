package store

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
)

// maxGroup bounds how many statements one group commit carries.
const maxGroup = 64

// group commits single-statement writes that arrive together in one
// transaction. A burst of warm creates is a burst of claims, each one
// UPDATE; alone, each paid a transaction of its own on the one writer
// connection (BEGIN, the WAL frames of the row and its four indexes, the
// commit): about 0.2 ms here, one after another, the longest serial part
// of a create. Twenty in one transaction cost about half as much each
// (internal/store benchmark, modernc SQLite). Nothing waits to gather a
// group: the first write runs at once, and whatever arrived while a
// transaction ran goes in the next one.
//
// Each write's outcome is its own statement's: a statement that fails
// fails its caller only. The transaction is rolled back (and the others
// of its group run again in a new one) so that no SQLite error that
// aborts a whole transaction can leave the group half applied.
type group struct {
	s *Store

	mu      sync.Mutex
	queue   []*groupWrite
	running bool

	commits atomic.Int64 // transactions begun (for tests)
}

// groupWrite is one caller's statement and, once done is closed, its
// outcome.
type groupWrite struct {
	query string
	args  []any
	// then, if set, runs right after the statement in its transaction;
	// its error is the write's outcome (see execThen).
	then func(ctx context.Context, t tx, res sql.Result) error

	res  sql.Result
	err  error
	done chan struct{}
}

// exec runs query as part of the next group commit and returns its result
// once that transaction committed (or its statement failed). Once queued a
// write is not given up: returning early on a cancelled caller could
// report as failed a claim that then commits.
func (g *group) exec(query string, args ...any) (sql.Result, error) {
	return g.execThen(nil, query, args...)
}

// execThen is exec, with then (if not nil) run right after the statement
// in the same transaction, seeing what the statement saw (a claim that
// changed no row reads why); then's error is returned as the write's.
func (g *group) execThen(then func(ctx context.Context, t tx, res sql.Result) error, query string, args ...any) (sql.Result, error) {
	w := &groupWrite{query: query, args: args, then: then, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start {
		go g.run()
	}
	<-w.done
	return w.res, w.err
}

// run commits groups until the queue is empty.
func (g *group) run() {
	var retry []*groupWrite
	for {
		g.mu.Lock()
		batch := append(retry, g.queue...)
		retry = nil
		if len(batch) > maxGroup {
			g.queue = batch[maxGroup:]
			batch = batch[:maxGroup]
		} else {
			g.queue = nil
		}
		if len(batch) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		retry = g.commit(batch)
	}
}

// commit runs batch in one transaction and finishes its writes; it returns
// the writes to run again: those of a transaction rolled back because
// another write's statement failed. It runs on a background context: no
// caller's end may cut a transaction that carries other callers' writes.
func (g *group) commit(batch []*groupWrite) (retry []*groupWrite) {
	ctx := context.Background()
	results := make([]sql.Result, len(batch))
	outcomes := make([]error, len(batch)) // what each write's then said
	failed := -1
	var stmtErr error
	g.commits.Add(1)
	err := g.s.inTx(ctx, func(t tx) error {
		for i, w := range batch {
			res, err := t.ExecContext(ctx, w.query, w.args...)
			if err != nil {
				failed, stmtErr = i, err
				return err
			}
			results[i] = res
			if w.then != nil {
				outcomes[i] = w.then(ctx, t, res)
			}
		}
		return nil
	})
	switch {
	case failed >= 0:
		// Only the failing statement's caller gets the error; the rest go
		// again in the next transaction.
		batch[failed].err = stmtErr
		close(batch[failed].done)
		retry = append(retry, batch[:failed]...)
		return append(retry, batch[failed+1:]...)
	case err != nil: // begin or commit
		for _, w := range batch {
			w.err = err
			close(w.done)
		}
	default:
		for i, w := range batch {
			w.res, w.err = results[i], outcomes[i]
			close(w.done)
		}
	}
	return nil
}
