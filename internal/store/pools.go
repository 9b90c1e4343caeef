package store

import (
	"context"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// PoolSetting is a warm pool an admin set while the server ran: it
// replaces the command line's pool of the same template and driver, and
// outlives restarts until it is deleted. A Size of 0 keeps no pool.
type PoolSetting struct {
	Template string
	Driver   string // resolved: never empty
	Size     int
	Max      int // the most its adaptive target grows to
	MemoryMB int
	CPU      int
	// NoPrestart turns off the process the template's pools start in
	// each warm sandbox (the E2B code interpreter's kernel).
	NoPrestart bool
	UpdatedAt  time.Time
}

// PutPoolSetting stores p, replacing the setting of its template and
// driver.
func (s *Store) PutPoolSetting(ctx context.Context, p PoolSetting) error {
	if p.Template == "" || p.Driver == "" || p.Size < 0 || p.Max < p.Size || p.MemoryMB < 0 || p.CPU < 0 {
		return errdefs.InvalidArgument("pool setting needs a template, a driver, a size of 0 or more, a max of at least the size, and a memory and CPUs of 0 or more")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO pool_settings(template, driver, size, max, memory_mb, cpu, prestart, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(template, driver) DO UPDATE SET size = excluded.size, max = excluded.max, memory_mb = excluded.memory_mb,
		cpu = excluded.cpu, prestart = excluded.prestart, updated_at = excluded.updated_at`,
		p.Template, p.Driver, p.Size, p.Max, p.MemoryMB, p.CPU, boolInt(!p.NoPrestart), toNanos(p.UpdatedAt))
	return classify(err, "pool setting of "+p.Template+" on "+p.Driver)
}

// PoolSettings lists the stored pool settings by template and driver.
func (s *Store) PoolSettings(ctx context.Context) ([]PoolSetting, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT template, driver, size, max, memory_mb, cpu, prestart, updated_at FROM pool_settings ORDER BY template, driver`)
	if err != nil {
		return nil, fmt.Errorf("store: list pool settings: %w", err)
	}
	defer rows.Close()
	var out []PoolSetting
	for rows.Next() {
		var p PoolSetting
		var at int64
		var prestart int
		if err := rows.Scan(&p.Template, &p.Driver, &p.Size, &p.Max, &p.MemoryMB, &p.CPU, &prestart, &at); err != nil {
			return nil, fmt.Errorf("store: list pool settings: %w", err)
		}
		p.UpdatedAt, p.NoPrestart = fromNanos(at), prestart == 0
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list pool settings: %w", err)
	}
	return out, nil
}

// DeletePoolSetting removes the setting of a template on a driver (the
// command line's pool, if any, applies again). Errors: errdefs.ErrNotFound.
func (s *Store) DeletePoolSetting(ctx context.Context, template, driver string) error {
	return s.deleteOne(ctx, "pool setting", errdefs.NotFound("no pool of %s on %s was set through the API", template, driver),
		`DELETE FROM pool_settings WHERE template = ? AND driver = ?`, template, driver)
}
