package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Key is an API key. Only the SHA-256 of the secret is stored.
type Key struct {
	ID        string
	Hash      []byte // sha256 of the secret
	Team      string
	Admin     bool
	Name      string
	CreatedAt time.Time
}

const keyCols = `id, hash, team, admin, name, created_at`

func scanKey(sc scanner) (Key, error) {
	var k Key
	var admin int
	var created int64
	if err := sc.Scan(&k.ID, &k.Hash, &k.Team, &admin, &k.Name, &created); err != nil {
		return Key{}, err
	}
	k.Admin = admin != 0
	k.CreatedAt = fromNanos(created)
	return k, nil
}

// CreateKey stores k. CreatedAt defaults to now. Errors:
// errdefs.ErrInvalidArgument for a missing id, hash or team,
// errdefs.ErrConflict if the id or hash exists.
func (s *Store) CreateKey(ctx context.Context, k Key) error {
	if k.ID == "" || len(k.Hash) == 0 || k.Team == "" {
		return errdefs.InvalidArgument("key needs an id, a hash and a team")
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = time.Now()
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO keys(`+keyCols+`) VALUES (?, ?, ?, ?, ?, ?)`,
		k.ID, k.Hash, k.Team, boolInt(k.Admin), k.Name, toNanos(k.CreatedAt))
	return classify(err, "key "+k.ID)
}

// KeyByHash returns the key whose secret hashes to hash.
// Errors: errdefs.ErrNotFound.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+keyCols+` FROM keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, errdefs.NotFound("key not found")
	}
	if err != nil {
		return Key{}, fmt.Errorf("store: key by hash: %w", err)
	}
	return k, nil
}

// ListKeys returns the keys of team (every team's if team is ""), oldest
// first.
func (s *Store) ListKeys(ctx context.Context, team string) ([]Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+keyCols+` FROM keys WHERE (? = '' OR team = ?) ORDER BY created_at, id`, team, team)
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	return out, nil
}

// DeleteKey removes the key id. Errors: errdefs.ErrNotFound.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	// The last admin key is kept: without one no key could be made or
	// removed until the server restarts (and re-adds its bootstrap key).
	const del = `DELETE FROM keys WHERE id = ?
		AND (admin = 0 OR (SELECT COUNT(*) FROM keys WHERE admin != 0) > 1)`
	var n int64
	if s.pg {
		// Two replicas deleting the last two admin keys at once would
		// each count the other's: the keys lock orders them.
		err := s.inTx(ctx, func(t tx) error {
			if err := s.dia.lock(ctx, t, lockKeys, ""); err != nil {
				return err
			}
			res, err := t.ExecContext(ctx, del, id)
			if err != nil {
				return err
			}
			n, _ = res.RowsAffected()
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: delete key: %w", err)
		}
	} else {
		res, err := s.w.ExecContext(ctx, del, id)
		if err != nil {
			return fmt.Errorf("store: delete key: %w", err)
		}
		n, _ = res.RowsAffected()
	}
	if n == 0 {
		var admin int
		if s.r.QueryRowContext(ctx, `SELECT admin FROM keys WHERE id = ?`, id).Scan(&admin) == nil {
			return errdefs.Conflict("key %s is the last admin key", id)
		}
		return errdefs.NotFound("key %s not found", id)
	}
	return nil
}
