package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// maxCachedStmts bounds the statement cache of one database. The store's
// queries are constant strings, a few dozen; a query built from its input
// (ListSandboxes) goes to the embedded *sql.DB and is never cached, and
// past the bound a new query is run unprepared rather than grow the cache.
const maxCachedStmts = 256

// db is a *sql.DB whose ExecContext, QueryContext and QueryRowContext run
// prepared statements cached by query text. SQLite parses a statement every
// time it is prepared, and an unprepared database/sql call prepares it on
// every run: parsing was a fifth of the server's CPU per exec (pprof: the
// API key lookup and the process log's insert and update). The embedded
// methods (d.DB.QueryContext) run a query unprepared.
type db struct {
	*sql.DB
	dia *dialect // queries are written for SQLite; on Postgres, translated

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
}

func newDB(d *sql.DB, dia *dialect) *db { return &db{DB: d, dia: dia, stmts: map[string]*sql.Stmt{}} }

// cached returns the cached statement for query, or nil.
func (d *db) cached(query string) *sql.Stmt {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stmts[query]
}

// stmt returns the cached statement for query, preparing it on first use;
// nil (run it unprepared) if the cache is full or preparing failed, so the
// caller's own call reports the error as before. Preparing takes one of the
// database's connections: never call it while holding the writer's (in a
// transaction).
func (d *db) stmt(ctx context.Context, query string) *sql.Stmt {
	if d.dia.pg {
		// pgx prepares and caches each statement on each connection
		// itself; a database/sql statement on top would only pin it to
		// connections.
		return nil
	}
	d.mu.Lock()
	st, ok := d.stmts[query]
	full := len(d.stmts) >= maxCachedStmts
	d.mu.Unlock()
	if ok || full {
		return st
	}
	st, err := d.DB.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.stmts[query]; ok || len(d.stmts) >= maxCachedStmts {
		// Another caller prepared it meanwhile, or filled the cache.
		st.Close()
		return old
	}
	d.stmts[query] = st
	return st
}

// ExecContext runs query (a statement on its own, committed by itself).
// On Postgres a statement the server chose as a deadlock's victim runs
// again, up to maxRetries times.
func (d *db) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := d.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	q := d.dia.query(query)
	for i := 0; ; i++ {
		res, err := d.DB.ExecContext(ctx, q, args...)
		if err == nil || i+1 >= maxRetries || !retryable(err) {
			return res, err
		}
	}
}

func (d *db) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := d.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return d.DB.QueryContext(ctx, d.dia.query(query), args...)
}

func (d *db) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := d.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return d.DB.QueryRowContext(ctx, d.dia.query(query), args...)
}

// queryBuilt runs a query built from its input: never prepared or cached
// (see maxCachedStmts).
func (d *db) queryBuilt(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return d.DB.QueryContext(ctx, d.dia.query(query), args...)
}

// Close closes the cached statements, then the database.
func (d *db) Close() error {
	d.mu.Lock()
	var errs []error
	for q, st := range d.stmts {
		errs = append(errs, st.Close())
		delete(d.stmts, q)
	}
	d.mu.Unlock()
	return errors.Join(append(errs, d.DB.Close())...)
}

// tx is a write transaction whose statements come from the writer's cache
// (database/sql reuses a statement already prepared on the transaction's
// connection, which is the writer's only one). A query not cached yet runs
// unprepared and is prepared once the transaction has let go of the
// connection (see Store.inTx).
type tx struct {
	*sql.Tx
	d        *db
	uncached *[]string
}

func (t tx) stmt(ctx context.Context, query string) *sql.Stmt {
	if t.d.dia.pg {
		return nil
	}
	st := t.d.cached(query)
	if st == nil {
		*t.uncached = append(*t.uncached, query)
		return nil
	}
	return t.Tx.StmtContext(ctx, st)
}

func (t tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := t.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, t.d.dia.query(query), args...)
}

func (t tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := t.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, t.d.dia.query(query), args...)
}

func (t tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := t.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, t.d.dia.query(query), args...)
}
