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

// Template build statuses.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// Template is the record of a named template and its latest build.
type Template struct {
	Name      string
	Digest    string
	Path      string
	Kind      string // "dir" (a root filesystem directory); "raw" later
	SizeBytes int64
	Recipe    json.RawMessage
	Status    string // TemplateBuilding, TemplateReady or TemplateFailed
	Error     string // why the build failed: Status TemplateFailed, or a failed rebuild while a ready build still serves
	BuiltAt   time.Time
	// Progress is the last line of a build in progress (filled in by the
	// server's template list, never stored).
	Progress string
}

const templateCols = `name, digest, path, kind, size_bytes, recipe, status, error, built_at`

func scanTemplate(sc scanner) (Template, error) {
	var t Template
	var recipe string
	var built int64
	if err := sc.Scan(&t.Name, &t.Digest, &t.Path, &t.Kind, &t.SizeBytes, &recipe, &t.Status, &t.Error, &built); err != nil {
		return Template{}, err
	}
	if recipe != "" && recipe != "null" {
		t.Recipe = json.RawMessage(recipe)
	}
	t.BuiltAt = fromNanos(built)
	return t, nil
}

// PutTemplate inserts or replaces the template named t.Name.
// Errors: errdefs.ErrInvalidArgument for a missing name or status, or a
// recipe that is not valid JSON.
func (s *Store) PutTemplate(ctx context.Context, t Template) error {
	if t.Name == "" || t.Status == "" {
		return errdefs.InvalidArgument("template needs a name and a status")
	}
	recipe := "null"
	if len(t.Recipe) > 0 {
		if !json.Valid(t.Recipe) {
			return errdefs.InvalidArgument("template %s: recipe is not valid JSON", t.Name)
		}
		recipe = string(t.Recipe)
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO templates(`+templateCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET digest = excluded.digest, path = excluded.path, kind = excluded.kind,
			size_bytes = excluded.size_bytes, recipe = excluded.recipe, status = excluded.status,
			error = excluded.error, built_at = excluded.built_at`,
		t.Name, t.Digest, t.Path, t.Kind, t.SizeBytes, recipe, t.Status, t.Error, toNanos(t.BuiltAt))
	return classify(err, "template "+t.Name)
}

// GetTemplate returns the template named name. Errors: errdefs.ErrNotFound.
func (s *Store) GetTemplate(ctx context.Context, name string) (Template, error) {
	t, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, errdefs.NotFound("template %s not found", name)
	}
	if err != nil {
		return Template{}, fmt.Errorf("store: get template: %w", err)
	}
	return t, nil
}

// ListTemplates returns every template, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]Template, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+templateCols+` FROM templates ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list templates: %w", err)
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list templates: %w", err)
	}
	return out, nil
}

// DeleteTemplate removes the template record name (not its files).
// Errors: errdefs.ErrNotFound.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	return s.deleteOne(ctx, "template", errdefs.NotFound("template %s not found", name), `DELETE FROM templates WHERE name = ?`, name)
}

// TemplateDigestsInUse returns every template digest a record still needs
// the build of: the templates', every sandbox's that is not stopped (its
// root filesystem, or a VM's backing image) and every snapshot's (a
// restore or a fork boots it).
func (s *Store) TemplateDigestsInUse(ctx context.Context) (map[string]bool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT digest FROM templates
		UNION SELECT template_digest FROM sandboxes WHERE state != 'stopped'
		UNION SELECT template_digest FROM snapshots`)
	if err != nil {
		return nil, fmt.Errorf("store: template digests in use: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("store: template digests in use: %w", err)
		}
		if d != "" {
			out[d] = true
		}
	}
	return out, rows.Err()
}
