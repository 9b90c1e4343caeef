package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Network is a sandbox's egress configuration: its policy as the user
// wrote it and its secret bindings (placeholder → secret name). The secret
// values live only in the egress secret store.
type Network struct {
	SandboxID string
	Allow     string
	Deny      string
	Secrets   map[string]string // placeholder → secret name
}

// PutNetwork inserts or replaces a sandbox's network record.
func (s *Store) PutNetwork(ctx context.Context, n Network) error {
	sec, err := json.Marshal(n.Secrets)
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO sandbox_network (sandbox_id, allow, deny, secrets) VALUES (?,?,?,?)
		ON CONFLICT(sandbox_id) DO UPDATE SET allow = excluded.allow, deny = excluded.deny, secrets = excluded.secrets`,
		n.SandboxID, n.Allow, n.Deny, string(sec))
	return classify(err, "network of "+n.SandboxID)
}

// DeleteNetwork removes a sandbox's network record (none is no error).
func (s *Store) DeleteNetwork(ctx context.Context, sandboxID string) error {
	_, err := s.w.ExecContext(ctx, `DELETE FROM sandbox_network WHERE sandbox_id = ?`, sandboxID)
	return classify(err, "network of "+sandboxID)
}

// GetNetwork returns a sandbox's network record. Errors:
// errdefs.ErrNotFound when it has none (no network).
func (s *Store) GetNetwork(ctx context.Context, sandboxID string) (Network, error) {
	n := Network{SandboxID: sandboxID}
	var sec string
	err := s.r.QueryRowContext(ctx, `SELECT allow, deny, secrets FROM sandbox_network WHERE sandbox_id = ?`, sandboxID).Scan(&n.Allow, &n.Deny, &sec)
	if errors.Is(err, sql.ErrNoRows) {
		return n, errdefs.NotFound("sandbox %s has no network", sandboxID)
	}
	if err != nil {
		return n, fmt.Errorf("store: get network: %w", err)
	}
	if err := json.Unmarshal([]byte(sec), &n.Secrets); err != nil {
		return n, fmt.Errorf("store: network secrets: %w", err)
	}
	return n, nil
}

// SecretMeta is what the control plane knows of a secret: never its value.
type SecretMeta struct {
	Team      string
	Name      string
	Hosts     []string
	CreatedAt time.Time
}

// PutSecretMeta records (or replaces) a team's secret.
func (s *Store) PutSecretMeta(ctx context.Context, m SecretMeta) error {
	hosts, _ := json.Marshal(m.Hosts)
	_, err := s.w.ExecContext(ctx, `INSERT INTO secrets (team, name, hosts, created_at) VALUES (?,?,?,?)
		ON CONFLICT(team, name) DO UPDATE SET hosts = excluded.hosts, created_at = excluded.created_at`,
		m.Team, m.Name, string(hosts), toNanos(m.CreatedAt))
	return classify(err, "secret "+m.Name)
}

// ListSecretMeta lists a team's secrets ("" = every team).
func (s *Store) ListSecretMeta(ctx context.Context, team string) ([]SecretMeta, error) {
	q := `SELECT team, name, hosts, created_at FROM secrets`
	var args []any
	if team != "" {
		q += ` WHERE team = ?`
		args = append(args, team)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY team, name`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	defer rows.Close()
	var out []SecretMeta
	for rows.Next() {
		var m SecretMeta
		var hosts string
		var created int64
		if err := rows.Scan(&m.Team, &m.Name, &hosts, &created); err != nil {
			return nil, err
		}
		json.Unmarshal([]byte(hosts), &m.Hosts)
		m.CreatedAt = fromNanos(created)
		out = append(out, m)
	}
	return out, rows.Err()
}

// GetSecretMeta returns one of a team's secrets. Errors: errdefs.ErrNotFound.
func (s *Store) GetSecretMeta(ctx context.Context, team, name string) (SecretMeta, error) {
	m := SecretMeta{Team: team, Name: name}
	var hosts string
	var created int64
	err := s.r.QueryRowContext(ctx, `SELECT hosts, created_at FROM secrets WHERE team = ? AND name = ?`, team, name).Scan(&hosts, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return m, errdefs.NotFound("secret %s not found", name)
	}
	if err != nil {
		return m, fmt.Errorf("store: get secret: %w", err)
	}
	json.Unmarshal([]byte(hosts), &m.Hosts)
	m.CreatedAt = fromNanos(created)
	return m, nil
}

// DeleteSecretMeta removes a team's secret. Errors: errdefs.ErrNotFound.
func (s *Store) DeleteSecretMeta(ctx context.Context, team, name string) error {
	return s.deleteOne(ctx, "secret", errdefs.NotFound("secret %s not found", name),
		`DELETE FROM secrets WHERE team = ? AND name = ?`, team, name)
}
