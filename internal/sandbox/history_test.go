package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// tarOf builds a one-file tar whose content is unique to n.
func tarOf(t *testing.T, n int) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	data := bytes.Repeat([]byte(fmt.Sprintf("content of snapshot %d\n", n)), 4096)
	tw.WriteHeader(&tar.Header{Name: "home/user/f.txt", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	return buf.Bytes()
}

func chunkCount(t *testing.T, root string) int {
	n := 0
	filepath.WalkDir(filepath.Join(root, "chunks"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// historyService is a Service on a real store and chunk store in a
// temporary directory, with snapshots on and the default retention.
func historyService(t *testing.T) (*store.Store, *snapshot.Store, *Service) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cs, err := snapshot.New(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	svc := New(Config{DataDir: dir}, st, nil, slog.New(slog.DiscardHandler), nil)
	svc.SetSnapshots(Snapshots{Store: cs, Interval: -1, Retention: snapshot.DefaultPolicy()})
	return st, cs, svc
}

// TestRetention runs the rolling history's retention over a week of
// snapshots on an injected clock, with a real store and chunk store: the
// thinning keeps exactly the expected set and GC frees the chunks of what
// it dropped.
func TestRetention(t *testing.T) {
	ctx := context.Background()
	st, cs, svc := historyService(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	svc.now = func() time.Time { return now }

	// One snapshot every 30 minutes for 8 days, plus a named one 3 days ago.
	var all []store.Snapshot
	for i := 0; i < 8*48; i++ {
		at := now.Add(-time.Duration(i) * 30 * time.Minute)
		sn := store.Snapshot{ID: fmt.Sprintf("snap-%04d", i), SandboxID: "sb-test", Team: "t", Kind: KindFiles, Status: store.SnapshotReady, CreatedAt: at}
		if i == 3*48 {
			sn.Name = "keep-me"
		}
		all = append(all, sn)
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.PutTar(ctx, sn.ID, bytes.NewReader(tarOf(t, i)), snapshot.Meta{CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	before := chunkCount(t, cs.Root())
	svc.RetainOnce(ctx)

	left, err := st.ListSnapshots(ctx, "sb-test", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sn := range left {
		got = append(got, sn.ID)
	}
	// Expected: everything from the last hour (3: now, -30m, -60m), the
	// newest of each older hour for a day, the newest of each older day
	// for a week, and the named one.
	var infos []snapshot.SnapInfo
	for _, sn := range all {
		infos = append(infos, snapshot.SnapInfo{ID: sn.ID, CreatedAt: sn.CreatedAt, Kind: snapshot.KindFiles, Named: sn.Name != ""})
	}
	want, _ := snapshot.Thin(infos, now, snapshot.DefaultPolicy())
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("kept %d snapshots %v, want %d %v", len(got), got, len(want), want)
	}
	if !slices.Contains(got, "snap-0144") {
		t.Errorf("named snapshot dropped")
	}
	for _, id := range got {
		sn, _ := st.GetSnapshot(ctx, id)
		if age := now.Sub(sn.CreatedAt); age > 7*24*time.Hour {
			t.Errorf("kept %s, %v old", id, age)
		}
	}
	if len(got) < 3+23+6 || len(got) > 3+24+8+1 {
		t.Errorf("kept %d snapshots: outside the hourly/daily shape", len(got))
	}
	// Dropped snapshots are gone from the chunk store and their chunks
	// freed; kept ones still read back.
	after := chunkCount(t, cs.Root())
	if after >= before || after > len(got)+2 {
		t.Errorf("chunks before %d, after %d, for %d kept snapshots", before, after, len(got))
	}
	for _, id := range got {
		if err := cs.Verify(ctx, id); err != nil {
			t.Errorf("kept %s does not verify: %v", id, err)
		}
	}
	if _, err := cs.Open("snap-0200"); err == nil && !slices.Contains(got, "snap-0200") {
		t.Errorf("dropped manifest still present")
	}
}

// TestRetentionPerSandbox: a sandbox that asks for one day of history keeps
// nothing older, while the server keeps a week for others; so does one
// whose record is gone (its snapshots recorded the day: it kept a week).
func TestRetentionPerSandbox(t *testing.T) {
	ctx := context.Background()
	st, cs, svc := historyService(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	svc.now = func() time.Time { return now }
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb-short", Team: "t", State: StateStopped, RetentionDays: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		at := now.Add(-time.Duration(i) * 24 * time.Hour)
		for _, sbID := range []string{"sb-short", "sb-long", "sb-gone"} {
			id := fmt.Sprintf("snap-%s-%d", sbID, i)
			days := 0
			if sbID != "sb-long" {
				days = 1
			}
			if err := st.CreateSnapshot(ctx, store.Snapshot{ID: id, SandboxID: sbID, Team: "t", Kind: KindFiles, Status: store.SnapshotReady, CreatedAt: at, RetentionDays: days}); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.PutTar(ctx, id, bytes.NewReader(tarOf(t, i)), snapshot.Meta{CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
		}
	}
	svc.RetainOnce(ctx)
	short, _ := st.ListSnapshots(ctx, "sb-short", "")
	long, _ := st.ListSnapshots(ctx, "sb-long", "")
	gone, _ := st.ListSnapshots(ctx, "sb-gone", "")
	if len(gone) != len(short) {
		t.Errorf("kept %d of a 1-day sandbox whose record is gone, want %d as for one whose record is there", len(gone), len(short))
	}
	for _, sn := range short {
		if now.Sub(sn.CreatedAt) > 24*time.Hour {
			t.Errorf("sb-short kept %s from %v ago", sn.ID, now.Sub(sn.CreatedAt))
		}
	}
	if len(short) != 2 || len(long) != 5 {
		t.Errorf("kept %d (1-day sandbox) and %d (server default): want 2 and 5", len(short), len(long))
	}
}

// TestRecoverFailsInterruptedSnapshots: a snapshot the previous server
// process left "creating" is failed (and its partial content dropped) by
// Recover, which returns before the server answers its first request.
func TestRecoverFailsInterruptedSnapshots(t *testing.T) {
	ctx := context.Background()
	st, cs, svc := historyService(t)
	now := time.Now().UTC()
	for _, sn := range []store.Snapshot{
		{ID: "snap-done", SandboxID: "sb-test", Team: "t", Kind: KindFiles, Status: store.SnapshotReady, CreatedAt: now},
		{ID: "snap-half", SandboxID: "sb-test", Team: "t", Kind: KindFiles, Status: store.SnapshotCreating, CreatedAt: now},
	} {
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.PutTar(ctx, sn.ID, bytes.NewReader(tarOf(t, 1)), snapshot.Meta{CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	half, err := st.GetSnapshot(ctx, "snap-half")
	if err != nil || half.Status != store.SnapshotFailed {
		t.Fatalf("interrupted snapshot after Recover: %+v, %v", half, err)
	}
	if _, err := cs.Open("snap-half"); err == nil {
		t.Error("the interrupted snapshot's content is still stored")
	}
	if done, err := st.GetSnapshot(ctx, "snap-done"); err != nil || done.Status != store.SnapshotReady {
		t.Errorf("finished snapshot after Recover: %+v, %v", done, err)
	}
	if err := cs.Verify(ctx, "snap-done"); err != nil {
		t.Errorf("finished snapshot does not verify: %v", err)
	}
}

// TestDeleteSnapshotBeingTaken: a snapshot still being taken (listed, so
// a client can see its id) cannot be deleted: deleting its record let the
// take write its manifests afterwards, which nothing removed and GC kept.
// Once it is ready the delete goes through and frees its content.
func TestDeleteSnapshotBeingTaken(t *testing.T) {
	ctx := context.Background()
	st, cs, svc := historyService(t)
	sn := store.Snapshot{ID: "snap-taking", SandboxID: "sb-test", Team: "t", Kind: KindFiles, Status: store.SnapshotCreating, CreatedAt: time.Now().UTC()}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	err := svc.DeleteSnapshot(ctx, Caller{Team: "t"}, sn.ID)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a snapshot being taken: %v, want a conflict", err)
	}
	if _, err := st.GetSnapshot(ctx, sn.ID); err != nil {
		t.Fatalf("the record went: %v", err)
	}
	// The take ends.
	if _, err := cs.PutTar(ctx, sn.ID, bytes.NewReader(tarOf(t, 1)), snapshot.Meta{CreatedAt: sn.CreatedAt}); err != nil {
		t.Fatal(err)
	}
	if err := st.FinishSnapshot(ctx, sn.ID, store.SnapshotReady, "", 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := svc.DeleteSnapshot(ctx, Caller{Team: "t"}, sn.ID); err != nil {
		t.Fatalf("delete of the ready snapshot: %v", err)
	}
	if _, err := cs.Open(sn.ID); err == nil {
		t.Error("the deleted snapshot's manifest is still stored")
	}
}

// TestSnapshotPinnedWhileRead: a snapshot whose content an operation is
// reading (here a file download, open until its reader is closed) is not
// dropped, by a delete or by retention, so GC keeps its chunks; once the
// read ends it goes as before.
func TestSnapshotPinnedWhileRead(t *testing.T) {
	ctx := context.Background()
	st, cs, svc := historyService(t)
	tplDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(tplDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := st.PutTemplate(ctx, store.Template{Name: "base", Digest: "d1", Path: tplDir, Status: store.TemplateReady}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	sn := store.Snapshot{ID: "snap-read", SandboxID: "sb-test", Team: "t", Kind: KindFiles, Template: "base", TemplateDigest: "d1", Status: store.SnapshotReady, CreatedAt: now}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.PutTar(ctx, sn.ID, bytes.NewReader(tarOf(t, 7)), snapshot.Meta{CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	f, err := svc.ReadSnapshotPath(ctx, Caller{Team: "t"}, sn.ID, "/home/user/f.txt")
	if err != nil || f.Content == nil {
		t.Fatalf("read a file of the snapshot: %+v %v", f, err)
	}
	if err := svc.DeleteSnapshot(ctx, Caller{Team: "t"}, sn.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete while the file is read: %v, want a conflict", err)
	}
	if err := svc.dropSnapshot(ctx, sn); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("retention's drop while the file is read: %v, want a conflict", err)
	}
	if _, err := cs.GC(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f.Content)
	if err != nil || !bytes.Contains(got, []byte("content of snapshot 7")) {
		t.Errorf("the file read after a GC: %d bytes, %v", len(got), err)
	}
	f.Content.Close()
	f.Content.Close() // a second close releases nothing more
	if err := svc.DeleteSnapshot(ctx, Caller{Team: "t"}, sn.ID); err != nil {
		t.Fatalf("delete once the read ended: %v", err)
	}
	if len(svc.pins) != 0 {
		t.Errorf("pins left: %v", svc.pins)
	}
}

// TestListFilterBounds: a list's filters are validated: a state named many
// times is one filter (40,000 of them overran SQLite's variable limit, a
// 500), and more metadata filters than a sandbox can hold entries, or a
// key no sandbox can have, are a 400 (a thousand overran SQLite's
// expression depth).
func TestListFilterBounds(t *testing.T) {
	ctx := context.Background()
	st, _, svc := historyService(t)
	if err := st.CreateSandbox(ctx, store.Sandbox{ID: "sb-one", Team: "t", State: StateRunning, Metadata: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	many := make([]string, 40000)
	for i := range many {
		many[i] = StateRunning
	}
	got, _, err := svc.List(ctx, Caller{Team: "t"}, ListOptions{States: many, Metadata: map[string]string{"k": "v"}})
	if err != nil || len(got) != 1 {
		t.Errorf("a state given 40,000 times: %d sandboxes, %v", len(got), err)
	}
	meta := map[string]string{}
	for i := range 65 {
		meta[fmt.Sprintf("k%d", i)] = "v"
	}
	if _, _, err := svc.List(ctx, Caller{Team: "t"}, ListOptions{Metadata: meta}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("65 metadata filters: %v, want invalid argument", err)
	}
	if _, _, err := svc.List(ctx, Caller{Team: "t"}, ListOptions{Metadata: map[string]string{"bad key": "v"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a metadata filter on an impossible key: %v, want invalid argument", err)
	}
}

// TestRestorePathsBounded: a restore names at most maxRestorePaths paths
// (each is matched against every change with the sandbox's lock held).
func TestRestorePathsBounded(t *testing.T) {
	_, _, svc := historyService(t)
	paths := make([]string, maxRestorePaths+1)
	for i := range paths {
		paths[i] = fmt.Sprintf("/home/user/f%d", i)
	}
	if _, err := svc.RestoreFiles(context.Background(), Caller{Team: "t"}, "sb-x", "snap-x", paths); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("%d paths: %v, want invalid argument", len(paths), err)
	}
}

// TestAutoSnapshotEveryPage: the rolling history considers every running
// sandbox, also past the first page of the list (it read one page only,
// and the newer sandboxes of a host with more never got a snapshot).
func TestAutoSnapshotEveryPage(t *testing.T) {
	ctx := context.Background()
	st, _, svc := historyService(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	svc.now = func() time.Time { return now }
	n := store.MaxListLimit + 5
	lives := make([]*live, n)
	for i := range n {
		id := fmt.Sprintf("sb-%05d", i)
		at := now.Add(-time.Hour + time.Duration(i)*time.Millisecond)
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, Team: "t", State: StateRunning, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
		// No instance: the snapshot fails at once, and the try is
		// recorded in autoTried.
		lives[i] = &live{}
		svc.live[id] = lives[i]
	}
	svc.AutoSnapshotOnce(ctx)
	for i, l := range lives {
		if l.autoTried.IsZero() {
			t.Fatalf("sandbox %d of %d (page size %d) never considered", i, n, store.MaxListLimit)
		}
	}
}
