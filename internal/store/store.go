// Package store owns the durable records of space: API keys, sandboxes (with
// their driver handles and state), templates and the processes started in
// sandboxes.
//
// It speaks database/sql to one of two databases. The embedded default is
// SQLite through the pure-Go modernc.org/sqlite driver (Open): the file is
// opened in WAL mode with a busy timeout and foreign keys on. Writes go
// through a single connection (BEGIN IMMEDIATE), so concurrent writers
// queue in Go instead of failing with SQLITE_BUSY; reads use a separate
// pool that WAL lets run beside the writer.
//
// Postgres (OpenPostgres, through pgx's database/sql driver) lets several
// control-plane replicas share the records. There is no single writer
// there, so what SQLite's serializes is made explicit (dialect.go):
// compare-and-set reads lock their row (SELECT … FOR UPDATE), admission
// under a team's quota holds a per-team advisory lock for its
// transaction, migrations run under an advisory lock (replicas starting
// together migrate once), and a transaction that loses a deadlock or a
// serialization conflict runs again (up to maxRetries times).
//
// Errors are errdefs classes: a missing record is errdefs.ErrNotFound, a
// duplicate id or key hash is errdefs.ErrConflict, and a compare-and-set on
// a sandbox's state that finds another state is errdefs.ErrConflict naming
// the current state.
//
// Times are stored as Unix nanoseconds (UTC); the zero time.Time is stored as
// 0 and read back as the zero time.Time.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/spacesandbox/space/internal/errdefs"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is a handle on the database. It is safe for concurrent use.
type Store struct {
	w *db // the one writer connection (Postgres: the pool, as r)
	r *db // readers (WAL lets them run beside the writer)
	// dia is the database's dialect; pg is dia.pg.
	dia *dialect
	pg  bool
	// grouped commits writes that arrive together in one transaction
	// (claims: see group).
	grouped group
}

// busyTimeout bounds how long a connection waits for a lock held by another
// process before SQLite reports SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// Open opens (creating if needed) the SQLite database at path and brings
// its schema up to date. Migrations are idempotent: reopening an up-to-date
// file changes nothing. A file a newer binary migrated (a schema version
// past this one's) is refused: running on it would be a silent downgrade.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errdefs.InvalidArgument("store: empty database path")
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	dsn := "file:" + path + "?" + q.Encode()

	w, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	dia := &dialect{}
	if err := migrate(ctx, w, dia); err != nil {
		w.Close()
		return nil, err
	}

	r, err := sql.Open("sqlite", dsn+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	st := &Store{w: newDB(w, dia), r: newDB(r, dia), dia: dia}
	st.grouped.s = st
	return st, nil
}

// Backend names the database the store runs on: "sqlite" or "postgres".
func (s *Store) Backend() string {
	if s.pg {
		return "postgres"
	}
	return "sqlite"
}

// IsPostgres reports whether database (a --database value) names a
// Postgres database (a postgres:// or postgresql:// URL) rather than a
// SQLite file.
func IsPostgres(database string) bool {
	return strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://")
}

// OpenDatabase opens database: a Postgres URL (OpenPostgres) or the path
// of a SQLite file (Open).
func OpenDatabase(ctx context.Context, database string) (*Store, error) {
	if IsPostgres(database) {
		return OpenPostgres(ctx, database)
	}
	return Open(ctx, database)
}

// maxPGConns bounds one Store's connections to Postgres (each replica's):
// the server's max_connections is shared by every replica.
const maxPGConns = 16

// OpenPostgres connects to the Postgres database at dsn (a postgres://
// URL pgx understands) and brings its schema up to date, as Open does for
// SQLite: under an advisory lock, so that replicas starting together
// apply each migration once; a newer binary's schema is refused.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	if !IsPostgres(dsn) {
		return nil, errdefs.InvalidArgument("store: %q is not a postgres:// URL", redactURL(dsn))
	}
	d, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", redactURL(dsn), err)
	}
	d.SetMaxOpenConns(maxPGConns)
	d.SetMaxIdleConns(maxPGConns)
	d.SetConnMaxIdleTime(5 * time.Minute)
	dia := &dialect{pg: true}
	if err := migratePG(ctx, d, dia); err != nil {
		d.Close()
		return nil, err
	}
	one := newDB(d, dia)
	st := &Store{w: one, r: one, dia: dia, pg: true}
	st.grouped.s = st
	return st, nil
}

// migratePG runs migrate on one connection holding the migration lock.
func migratePG(ctx context.Context, d *sql.DB, dia *dialect) error {
	conn, err := d.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1, 0)`, lockMigrate); err != nil {
		return fmt.Errorf("store: migration lock: %w", err)
	}
	// The lock is the session's: released here, or by the server when the
	// connection ends (a replica that died mid-migration).
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, 0)`, lockMigrate)
	return migrate(ctx, conn, dia)
}

// redactURL is the URL u without its password, for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// Close closes the database.
func (s *Store) Close() error {
	if s.r == s.w {
		return s.w.Close()
	}
	return errors.Join(s.r.Close(), s.w.Close())
}

// SchemaVersion reports the schema version the database is at.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return v, nil
}

// inTx runs fn in a write transaction (BEGIN IMMEDIATE on the writer),
// committing if fn returns nil. Statements fn ran unprepared (the first
// time each is seen) are prepared for next time once the writer's
// connection is free again. On Postgres (READ COMMITTED), a transaction
// that lost a deadlock or a serialization conflict is rolled back and fn
// runs again, up to maxRetries times: fn must be safe to run twice.
func (s *Store) inTx(ctx context.Context, fn func(t tx) error) error {
	var uncached []string
	defer func() {
		for _, q := range uncached {
			s.w.stmt(ctx, q)
		}
	}()
	for i := 0; ; i++ {
		err := s.tryTx(ctx, fn, &uncached)
		if err == nil || !s.pg || i+1 >= maxRetries || !retryable(err) {
			return err
		}
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(t tx) error, uncached *[]string) error {
	t, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	if err := fn(tx{Tx: t, d: s.w, uncached: uncached}); err != nil {
		t.Rollback()
		return err
	}
	if err := t.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// classify turns driver errors into errdefs classes: constraint violations
// on unique keys become ErrConflict, foreign-key violations ErrNotFound.
// what names the record for the message ("sandbox sb-1").
// deleteOne runs a DELETE that should remove one row; none is notFound.
func (s *Store) deleteOne(ctx context.Context, what string, notFound error, query string, args ...any) error {
	res, err := s.w.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: delete %s: %w", what, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound
	}
	return nil
}

func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505": // unique_violation
			return fmt.Errorf("%s already exists: %w", what, errdefs.ErrConflict)
		case "23503": // foreign_key_violation
			return fmt.Errorf("%s refers to a missing record: %w", what, errdefs.ErrNotFound)
		}
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return fmt.Errorf("%s already exists: %w", what, errdefs.ErrConflict)
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return fmt.Errorf("%s refers to a missing record: %w", what, errdefs.ErrNotFound)
		}
	}
	return fmt.Errorf("store: %s: %w", what, err)
}

// Time encoding: Unix nanoseconds, 0 for the zero time.

func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func toNullNanos(t *time.Time) sql.NullInt64 {
	if t == nil || t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

func fromNullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}

// JSON map columns: a nil map is stored as {} and read back as an empty,
// non-nil map.

func encodeMap(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("store: encode map: %w", err)
	}
	return string(b), nil
}

func decodeMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if s == "" {
		return m, nil
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("store: decode map: %w", err)
	}
	return m, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// scanner is the common part of *sql.Row and *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}
