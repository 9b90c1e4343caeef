package store

import (
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// TestSnapshotTimeline: deleting a snapshot gives its children its parent,
// so no timeline names a deleted snapshot; TeamSnapshots lists one team's.
func TestSnapshotTimeline(t *testing.T) { forBackends(t, testSnapshotTimeline) }

func testSnapshotTimeline(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	t0 := time.Unix(1700000000, 0)
	parent := ""
	for i, id := range []string{"a", "b", "c"} {
		if err := s.CreateSnapshot(ctx, Snapshot{ID: id, SandboxID: "sb-1", Team: "t1", Kind: "files", Parent: parent,
			Status: SnapshotReady, CreatedAt: t0.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
		parent = id
	}
	if err := s.CreateSnapshot(ctx, Snapshot{ID: "z", SandboxID: "sb-2", Team: "t2", Kind: "files", Status: SnapshotReady, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	parentOf := func(id string) string {
		t.Helper()
		sn, err := s.GetSnapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sn.Parent
	}
	if err := s.DeleteSnapshot(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if p := parentOf("c"); p != "a" {
		t.Errorf("parent of c after deleting b = %q, want a", p)
	}
	if err := s.DeleteSnapshot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if p := parentOf("c"); p != "" {
		t.Errorf("parent of c after deleting a = %q, want none", p)
	}
	if err := s.DeleteSnapshot(ctx, "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
	// A parent already gone (a timeline from before this rule) is no
	// reason for the delete of a missing id to fail otherwise.
	if err := s.CreateSnapshot(ctx, Snapshot{ID: "d", SandboxID: "sb-3", Team: "t1", Kind: "files", Parent: "gone",
		Status: SnapshotCreating, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "gone"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete of a missing parent: %v", err)
	}
	if p := parentOf("c"); p != "" {
		t.Errorf("a failed delete changed c's parent to %q", p)
	}
	got, err := s.TeamSnapshots(ctx, "t1", SnapshotReady)
	if err != nil || len(got) != 1 || got[0].ID != "c" {
		t.Errorf("TeamSnapshots(t1) = %+v, %v", got, err)
	}
	if got, _ := s.TeamSnapshots(ctx, "", ""); len(got) != 0 {
		t.Errorf("TeamSnapshots of no team listed %d", len(got))
	}
}
