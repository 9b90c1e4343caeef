package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// takenCounter counts the "snapshot taken" records a Service logs.
type takenCounter struct {
	slog.Handler
	n *atomic.Int32
}

func (h takenCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "snapshot taken" {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h takenCounter) Enabled(context.Context, slog.Level) bool { return true }

// TestAutoSnapshotWaitsAfterUnchanged runs the rolling history on a real
// gVisor sandbox with an injected clock: the first automatic snapshot is
// kept, a second of unchanged files is dropped, and the history does not
// export the layer again until a whole interval after that try (it did at
// every tick, 30 s, for an idle sandbox); once the files changed, the next
// due try keeps a new point.
func TestAutoSnapshotWaitsAfterUnchanged(t *testing.T) {
	svc, st, _ := realService(t)
	ctx := context.Background()
	var taken atomic.Int32
	svc.log = slog.New(takenCounter{Handler: slog.DiscardHandler, n: &taken})
	cs, err := snapshot.New(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	svc.SetSnapshots(Snapshots{Store: cs, Interval: time.Minute, Retention: snapshot.DefaultPolicy()})
	var mu sync.Mutex
	clock := time.Now()
	svc.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	at := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	sb, err := svc.Create(ctx, Caller{Team: "t"}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ready := func() int {
		t.Helper()
		snaps, err := st.ListSnapshots(ctx, sb.ID, store.SnapshotReady)
		if err != nil {
			t.Fatal(err)
		}
		return len(snaps)
	}
	step := func(what string, d time.Duration, wantTaken, wantReady int) {
		t.Helper()
		at(d)
		svc.AutoSnapshotOnce(ctx)
		if n, r := int(taken.Load()), ready(); n != wantTaken || r != wantReady {
			t.Fatalf("%s: %d snapshots taken, %d kept; want %d and %d", what, n, r, wantTaken, wantReady)
		}
	}
	step("first due", 2*time.Minute, 1, 1)
	step("due again, files unchanged", 2*time.Minute, 2, 1)
	step("half an interval after the unchanged try", 30*time.Second, 2, 1)
	if code := exitCode(t, svc, sb.ID, "/bin/sh", "-c", "echo new > /home/user/changed"); code != 0 {
		t.Fatalf("write a file: exit %d", code)
	}
	step("a whole interval after it, files changed", 31*time.Second, 3, 2)
}

// TestRestoreCheckpointOfGoneSandbox: a checkpoint outlives its sandbox's
// record (stopped records go after a day); a create from it restores the
// machine the checkpoint recorded (its memory, its env, plus the
// request's env), not a guess of 1 CPU and 512 MiB (on a VM driver, a
// quota bypass: the VM restores its own size), and a request with env no
// longer panics on the missing parent's nil env. A checkpoint without the
// record of its machine (taken by an older server) is refused.
func TestRestoreCheckpointOfGoneSandbox(t *testing.T) {
	svc, st, cs := snapService(t)
	ctx := context.Background()
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{MemoryMB: 384, Env: map[string]string{"FROM": "parent"}})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := svc.Snapshot(ctx, c, sb.ID, SnapshotRequest{Kind: KindCheckpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Kill(ctx, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := svc.Create(ctx, c, CreateRequest{Snapshot: sn.ID, Env: map[string]string{"ADDED": "yes"}})
	if err != nil {
		t.Fatalf("create from the checkpoint of a gone sandbox: %v", err)
	}
	if got.MemoryMB != 384 || got.CPU != sb.CPU || got.Driver != sb.Driver {
		t.Errorf("restored machine: %d CPU, %d MiB, %s; want the checkpoint's %d, 384, %s", got.CPU, got.MemoryMB, got.Driver, sb.CPU, sb.Driver)
	}
	if got.Env["FROM"] != "parent" || got.Env["ADDED"] != "yes" {
		t.Errorf("restored env: %v, want the checkpoint's and the request's", got.Env)
	}

	// A checkpoint whose manifest does not say its machine.
	old := store.Snapshot{ID: "snap-oldserver", SandboxID: "sb-gone", Team: "t", Kind: KindCheckpoint, Template: sn.Template, TemplateDigest: sn.TemplateDigest, Status: store.SnapshotReady, CreatedAt: time.Now().UTC()}
	if err := st.CreateSnapshot(ctx, old); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.PutDir(ctx, old.ID, dir, snapshot.Meta{Kind: snapshot.KindCheckpoint}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Create(ctx, c, CreateRequest{Snapshot: old.ID}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create from a checkpoint without its machine: %v, want unavailable", err)
	}
}

// snapService is realService with snapshots on (no automatic ones).
func snapService(t *testing.T) (*Service, *store.Store, *snapshot.Store) {
	t.Helper()
	svc, st, _ := realService(t)
	cs, err := snapshot.New(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	svc.SetSnapshots(Snapshots{Store: cs, Interval: -1, Retention: snapshot.DefaultPolicy()})
	return svc, st, cs
}

// TestRestoreFinishesWithoutItsClient: a restore from a checkpoint whose
// request context ends (the client went away) still finishes, as a create
// does: it ran on the request's context, and the cancellation failed it
// half way with a rollback that could neither destroy the restored
// instance nor update its record.
func TestRestoreFinishesWithoutItsClient(t *testing.T) {
	svc, st, _ := snapService(t)
	ctx := context.Background()
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := svc.Snapshot(ctx, c, sb.ID, SnapshotRequest{Kind: KindCheckpoint})
	if err != nil {
		t.Fatal(err)
	}
	image, _, err := svc.materialize(ctx, c, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(image)
	parent, err := st.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	got, err := svc.restoreSandbox(gone, c, parent, image, CreateRequest{})
	if err != nil {
		t.Fatalf("restore with its client gone: %v", err)
	}
	if got.State != StateRunning {
		t.Errorf("restored sandbox is %s", got.State)
	}
	if code := exitCode(t, svc, got.ID, "true"); code != 0 {
		t.Errorf("exec in the restored sandbox: exit %d", code)
	}
}

// TestSnapshotQuotaConcurrent: a team with a snapshot quota takes its
// snapshots one at a time, so of two taken at once by two sandboxes, each
// writing more than the quota, only the first is taken (the one that
// crosses the quota, whole) and the second is refused; both passed the
// check, which counts ready snapshots only.
func TestSnapshotQuotaConcurrent(t *testing.T) {
	svc, _, _ := snapService(t)
	ctx := context.Background()
	c := Caller{Team: "t"}
	if err := svc.SetQuota(ctx, Caller{Admin: true}, "t", store.Quota{MaxSnapshotMB: 1}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		sb, err := svc.Create(ctx, c, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, svc, sb.ID, "/bin/sh", "-c", "head -c 3000000 /dev/urandom > /home/user/big"); code != 0 {
			t.Fatalf("write: exit %d", code)
		}
		ids = append(ids, sb.ID)
	}
	errs := make(chan error, 2)
	for _, id := range ids {
		go func() {
			_, err := svc.Snapshot(ctx, c, id, SnapshotRequest{Kind: KindFiles})
			errs <- err
		}()
	}
	var ok, refused int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrQuotaExceeded):
			refused++
		default:
			t.Fatalf("snapshot: %v", err)
		}
	}
	if ok != 1 || refused != 1 {
		t.Errorf("two snapshots at once past a 1 MiB quota: %d taken, %d refused; want 1 and 1", ok, refused)
	}
}
