package store

import (
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestPoolSettings(t *testing.T) { forBackends(t, testPoolSettings) }

func testPoolSettings(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if ps, err := s.PoolSettings(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("fresh store: %+v, %v", ps, err)
	}
	at := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	put := func(p PoolSetting) {
		t.Helper()
		if err := s.PutPoolSetting(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	put(PoolSetting{Template: "python-data", Driver: "gvisor", Size: 2, Max: 8, MemoryMB: 1024, CPU: 1, UpdatedAt: at})
	put(PoolSetting{Template: "base", Driver: "qemu", Size: 0, Max: 0, UpdatedAt: at})
	// The same template and driver: replaced, not added.
	put(PoolSetting{Template: "python-data", Driver: "gvisor", Size: 5, Max: 20, MemoryMB: 2048, CPU: 2, NoPrestart: true, UpdatedAt: at.Add(time.Minute)})
	for _, bad := range []PoolSetting{
		{Driver: "gvisor", Size: 1, Max: 4},
		{Template: "base", Size: 1, Max: 4},
		{Template: "base", Driver: "gvisor", Size: -1},
		{Template: "base", Driver: "gvisor", Size: 3, Max: 2},
		{Template: "base", Driver: "gvisor", Size: 1, Max: 4, MemoryMB: -1},
	} {
		if err := s.PutPoolSetting(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("PutPoolSetting(%+v) = %v, want invalid argument", bad, err)
		}
	}
	// Kept across a reopen of the database.
	s.Close()
	s = open()
	got, err := s.PoolSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []PoolSetting{
		{Template: "base", Driver: "qemu", UpdatedAt: at},
		{Template: "python-data", Driver: "gvisor", Size: 5, Max: 20, MemoryMB: 2048, CPU: 2, NoPrestart: true, UpdatedAt: at.Add(time.Minute)},
	}
	if len(got) != len(want) {
		t.Fatalf("PoolSettings = %+v, want %+v", got, want)
	}
	for i := range want {
		if !got[i].UpdatedAt.Equal(want[i].UpdatedAt) {
			t.Errorf("setting %d updated at %v, want %v", i, got[i].UpdatedAt, want[i].UpdatedAt)
		}
		got[i].UpdatedAt, want[i].UpdatedAt = time.Time{}, time.Time{}
		if got[i] != want[i] {
			t.Errorf("setting %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if err := s.DeletePoolSetting(ctx, "python-data", "gvisor"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePoolSetting(ctx, "python-data", "gvisor"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if got, _ := s.PoolSettings(ctx); len(got) != 1 || got[0].Template != "base" {
		t.Fatalf("after delete: %+v", got)
	}
}
