package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Never edit a released migration: append a new one.
var migrations = []string{
	// 1: keys, sandboxes, templates, processes.
	`
CREATE TABLE keys (
	id         TEXT PRIMARY KEY,
	hash       BLOB NOT NULL UNIQUE,
	team       TEXT NOT NULL,
	admin      INTEGER NOT NULL DEFAULT 0,
	name       TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL
);
CREATE INDEX keys_team ON keys(team, created_at);

CREATE TABLE sandboxes (
	id              TEXT PRIMARY KEY,
	team            TEXT NOT NULL,
	template        TEXT NOT NULL DEFAULT '',
	template_digest TEXT NOT NULL DEFAULT '',
	driver          TEXT NOT NULL DEFAULT '',
	state           TEXT NOT NULL,
	reason          TEXT NOT NULL DEFAULT '',
	handle          BLOB,
	env             TEXT NOT NULL DEFAULT '{}',
	metadata        TEXT NOT NULL DEFAULT '{}',
	cpu             INTEGER NOT NULL DEFAULT 0,
	memory_mb       INTEGER NOT NULL DEFAULT 0,
	timeout_s       INTEGER NOT NULL DEFAULT 0,
	on_timeout      TEXT NOT NULL DEFAULT '',
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL,
	expires_at      INTEGER NOT NULL DEFAULT 0,
	stopped_at      INTEGER
);
CREATE INDEX sandboxes_team ON sandboxes(team, created_at, id);
CREATE INDEX sandboxes_list ON sandboxes(created_at, id);
CREATE INDEX sandboxes_expiry ON sandboxes(expires_at) WHERE expires_at > 0 AND stopped_at IS NULL;

CREATE TABLE templates (
	name       TEXT PRIMARY KEY,
	digest     TEXT NOT NULL DEFAULT '',
	path       TEXT NOT NULL DEFAULT '',
	kind       TEXT NOT NULL DEFAULT '',
	size_bytes INTEGER NOT NULL DEFAULT 0,
	recipe     TEXT NOT NULL DEFAULT 'null',
	status     TEXT NOT NULL,
	error      TEXT NOT NULL DEFAULT '',
	built_at   INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE processes (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	pid        INTEGER NOT NULL,
	cmd        TEXT NOT NULL DEFAULT '[]',
	tag        TEXT NOT NULL DEFAULT '',
	background INTEGER NOT NULL DEFAULT 0,
	started_at INTEGER NOT NULL,
	exit_code  INTEGER,
	exited_at  INTEGER
);
CREATE INDEX processes_sandbox ON processes(sandbox_id, pid);
`,
	// 2: snapshots. Not tied to the sandbox row by a foreign key: a
	// snapshot outlives its sandbox (history is kept up to a week).
	`
CREATE TABLE snapshots (
	id              TEXT PRIMARY KEY,
	sandbox_id      TEXT NOT NULL,
	team            TEXT NOT NULL,
	kind            TEXT NOT NULL,
	name            TEXT NOT NULL DEFAULT '',
	parent          TEXT NOT NULL DEFAULT '',
	template        TEXT NOT NULL DEFAULT '',
	template_digest TEXT NOT NULL DEFAULT '',
	automatic       INTEGER NOT NULL DEFAULT 0,
	status          TEXT NOT NULL,
	error           TEXT NOT NULL DEFAULT '',
	bytes_new       INTEGER NOT NULL DEFAULT 0,
	bytes_total     INTEGER NOT NULL DEFAULT 0,
	created_at      INTEGER NOT NULL
);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);
CREATE INDEX snapshots_team ON snapshots(team, created_at);
`,
	// 3: egress: a sandbox's network policy and secret bindings (kept
	// across restarts, pause and fork), and secret ownership.
	`
CREATE TABLE sandbox_network (
	sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
	allow      TEXT NOT NULL DEFAULT '',
	deny       TEXT NOT NULL DEFAULT '',
	secrets    TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE secrets (
	team       TEXT NOT NULL,
	name       TEXT NOT NULL,
	hosts      TEXT NOT NULL DEFAULT '[]',
	created_at INTEGER NOT NULL,
	PRIMARY KEY (team, name)
);
`,
	// 4: per-sandbox snapshot history settings.
	`
ALTER TABLE sandboxes ADD COLUMN snapshot_interval_s INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN retention_days INTEGER NOT NULL DEFAULT 0;
`,
	// 5: per-team quotas, and an index for counting a team's live sandboxes.
	`
CREATE TABLE team_quotas (
	team          TEXT PRIMARY KEY,
	max_sandboxes INTEGER NOT NULL DEFAULT 0,
	max_memory_mb INTEGER NOT NULL DEFAULT 0,
	updated_at    INTEGER NOT NULL
);
CREATE INDEX sandboxes_live_team ON sandboxes(team) WHERE state IN ('creating', 'running', 'paused', 'stopping');
`,
	// 6: a team's limit on the data its snapshots hold.
	`
ALTER TABLE team_quotas ADD COLUMN max_snapshot_mb INTEGER NOT NULL DEFAULT 0;
`,
	// 7: ports reachable without a token on the E2B listener.
	`
ALTER TABLE sandboxes ADD COLUMN public_ports INTEGER NOT NULL DEFAULT 0;
`,
	// 8: a team's limit on the CPUs its sandboxes hold together.
	`
ALTER TABLE team_quotas ADD COLUMN max_cpu INTEGER NOT NULL DEFAULT 0;
`,
	// 9: a team's limit on API requests per second.
	`
ALTER TABLE team_quotas ADD COLUMN max_rps INTEGER NOT NULL DEFAULT 0;
`,
	// 10: a paused sandbox that a request wakes (E2B's autoResume).
	`
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
`,
	// 11: the live-team index covers the quota count (state, memory and
	// CPUs in the index: no row read per sandbox counted).
	`
DROP INDEX sandboxes_live_team;
CREATE INDEX sandboxes_live_team ON sandboxes(team, state, memory_mb, cpu) WHERE state IN ('creating', 'running', 'paused', 'stopping');
`,
	// 12: warm pools an admin set through the API (PUT /v1/pools), each
	// replacing the command line's pool of its template and driver.
	`
CREATE TABLE pool_settings (
	template   TEXT NOT NULL,
	driver     TEXT NOT NULL,
	size       INTEGER NOT NULL,
	max        INTEGER NOT NULL,
	memory_mb  INTEGER NOT NULL,
	cpu        INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (template, driver)
);
`,
	// 13: a sandbox's commands read back in order, a page at a time
	// (GET /v1/sandboxes/{id}/commands).
	`
CREATE INDEX processes_sandbox_seq ON processes(sandbox_id, seq);
`,
	// 14: a pool setting may turn its template's prestarted process off.
	`
ALTER TABLE pool_settings ADD COLUMN prestart INTEGER NOT NULL DEFAULT 1;
`,
	// 15: a snapshot keeps its sandbox's retention_days, which still
	// applies once the sandbox's record is gone.
	`
ALTER TABLE snapshots ADD COLUMN retention_days INTEGER NOT NULL DEFAULT 0;
`,
	// 16: a sandbox left in state error (its instance could not be
	// destroyed) counts against its team's quota: the live-team index
	// names the quota's states (liveStates), error now among them.
	`
DROP INDEX sandboxes_live_team;
CREATE INDEX sandboxes_live_team ON sandboxes(team, state, memory_mb, cpu) WHERE state IN ('creating', 'running', 'paused', 'stopping', 'error');
`,
	// 17: a snapshot after every command (snapshot_on_exec), and the
	// command a snapshot was taken after (its process seq and command line).
	`
ALTER TABLE sandboxes ADD COLUMN snapshot_on_exec INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN command_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN cause TEXT NOT NULL DEFAULT '';
`,
	// 18: a sandbox's disk reservation (the most host disk its writable
	// layer may fill: 10 GiB, the drivers' size before it was a
	// parameter) and a team cap on their sum. The live-team index covers
	// it, so quota checks still read the index only.
	`
ALTER TABLE sandboxes ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 10240;
ALTER TABLE team_quotas ADD COLUMN max_disk_mb INTEGER NOT NULL DEFAULT 0;
DROP INDEX sandboxes_live_team;
CREATE INDEX sandboxes_live_team ON sandboxes(team, state, memory_mb, cpu, disk_mb) WHERE state IN ('creating', 'running', 'paused', 'stopping', 'error');
`,
}

// migrator is what migrate runs on: the SQLite writer's *sql.DB, or the
// one Postgres connection that holds the migration lock (*sql.Conn).
type migrator interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// migrate brings the database to the latest schema version. Each pending
// migration runs in its own transaction together with the bump of
// schema_version, so a crash leaves the schema at a whole version.
func migrate(ctx context.Context, db migrator, dia *dialect) error {
	if _, err := db.ExecContext(ctx, dia.ddl(`CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`)); err != nil {
		return fmt.Errorf("store: create schema_version: %w", err)
	}
	// A newer binary's schema: this one would run on tables and indexes it
	// does not know (a downgrade), so it refuses instead.
	var newest int
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&newest); err != nil {
		return fmt.Errorf("store: read schema_version: %w", err)
	}
	if newest > len(migrations) {
		return fmt.Errorf("store: database schema version %d is newer than this binary's %d (a newer space wrote it); refusing to open it: run that version or a newer one", newest, len(migrations))
	}
	for i, m := range migrations {
		version := i + 1
		err := func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var applied int
			// Checked inside the (immediate) transaction so two processes
			// opening a fresh file apply each migration once (on Postgres
			// the migration lock serializes them).
			if err := tx.QueryRowContext(ctx, dia.query(`SELECT COUNT(*) FROM schema_version WHERE version = ?`), version).Scan(&applied); err != nil {
				return err
			}
			if applied > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, dia.ddl(m)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, dia.query(`INSERT INTO schema_version(version, applied_at) VALUES (?, strftime('%s','now'))`), version); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			return fmt.Errorf("store: migration %d: %w", version, err)
		}
	}
	return nil
}
