package store

import (
	"errors"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

// One server at a time runs sandboxes on a Postgres database: a second
// one's claim is refused until the first releases it; on SQLite (one
// server per file, by the data directory's lock) it always succeeds.
func TestHoldSandboxHost(t *testing.T) { forBackends(t, testHoldSandboxHost) }

func testHoldSandboxHost(t *testing.T, open opener) {
	ctx := t.Context()
	a, b := open(), open()
	release, err := a.HoldSandboxHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.HoldSandboxHost(ctx)
	switch {
	case a.pg && !errors.Is(err, errdefs.ErrConflict):
		t.Fatalf("a second sandbox host on one Postgres database: %v, want a conflict", err)
	case !a.pg && err != nil:
		t.Fatalf("SQLite: %v", err)
	case !a.pg:
		second()
	}
	release()
	again, err := b.HoldSandboxHost(ctx)
	if err != nil {
		t.Fatalf("once the first released it: %v", err)
	}
	again()
}
