package sandbox

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// gatedDriver is the real gVisor driver whose checkpoints wait for gate
// to close and then fail when fail is set.
type gatedDriver struct {
	driver.Driver
	gate chan struct{}
	fail atomic.Bool
}

func (d *gatedDriver) Create(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
	inst, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &gatedInstance{Instance: inst, d: d}, nil
}

type gatedInstance struct {
	driver.Instance
	d *gatedDriver
}

func (i *gatedInstance) Checkpoint(ctx context.Context, dir string, leaveRunning bool) error {
	<-i.d.gate
	if i.d.fail.Load() {
		return errors.New("injected: checkpoint failed")
	}
	return i.Instance.(driver.Checkpointer).Checkpoint(ctx, dir, leaveRunning)
}

func (i *gatedInstance) ExportUpper(ctx context.Context, w io.Writer) error {
	return i.Instance.(driver.UpperExporter).ExportUpper(ctx, w)
}

func (i *gatedInstance) Detach() {
	if dt, ok := i.Instance.(driver.Detacher); ok {
		dt.Detach()
	}
}

// TestPauseAnswersBeforeItsCheckpoint: a pause with the rolling history's
// checkpoint answers once the sandbox is frozen, with the checkpoint's
// timeline entry creating (the checkpoint here waits for the test: a pause
// that waited for it would never answer); a resume asked meanwhile waits
// for the checkpoint; a checkpoint that fails is marked failed with its
// error and leaves the sandbox paused, and it resumes and runs.
func TestPauseAnswersBeforeItsCheckpoint(t *testing.T) {
	gd := &gatedDriver{gate: make(chan struct{})}
	gd.fail.Store(true)
	svc, st, _ := realServiceWith(t, func(d driver.Driver) driver.Driver { gd.Driver = d; return gd })
	cs, err := snapshot.New(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	svc.SetSnapshots(Snapshots{Store: cs, Interval: -1, CheckpointOnPause: true, Retention: snapshot.DefaultPolicy()})
	ctx := context.Background()
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := svc.Pause(ctx, c, sb.ID)
	if err != nil || paused.State != StatePaused {
		t.Fatalf("pause: %+v, %v", paused, err)
	}
	snaps, err := st.ListSnapshots(ctx, sb.ID, "")
	if err != nil || len(snaps) != 1 || snaps[0].Kind != KindCheckpoint || snaps[0].Status != store.SnapshotCreating || !snaps[0].Automatic {
		t.Fatalf("timeline when the pause answered: %+v, %v; want its checkpoint creating", snaps, err)
	}
	resumed := make(chan error, 1)
	go func() {
		_, err := svc.Resume(ctx, c, sb.ID)
		resumed <- err
	}()
	select {
	case err := <-resumed:
		t.Fatalf("resume answered (%v) while the pause's checkpoint was still being taken", err)
	case <-time.After(300 * time.Millisecond): // long enough for a resume that does not wait
	}
	if cur, _ := st.GetSandbox(ctx, sb.ID); cur.State != StatePaused {
		t.Errorf("state while the checkpoint runs: %s", cur.State)
	}
	close(gd.gate)
	if err := <-resumed; err != nil {
		t.Fatalf("resume after the failed checkpoint: %v", err)
	}
	sn, err := st.GetSnapshot(ctx, snaps[0].ID)
	if err != nil || sn.Status != store.SnapshotFailed || !strings.Contains(sn.Error, "injected") {
		t.Errorf("the failed checkpoint: %+v, %v; want failed with its error", sn, err)
	}
	if pid, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}}); err != nil || pid <= 0 {
		t.Errorf("exec after resume: %d, %v", pid, err)
	}

	// Checkpoints work again: the next pause's is stored.
	gd.fail.Store(false)
	if _, err := svc.Pause(ctx, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Resume(ctx, c, sb.ID); err != nil { // waits for it
		t.Fatal(err)
	}
	snaps, _ = st.ListSnapshots(ctx, sb.ID, "")
	if last := snaps[len(snaps)-1]; last.Status != store.SnapshotReady || last.ID == sn.ID {
		t.Errorf("the second pause's checkpoint: %+v", last)
	}
	if pid, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}}); err != nil || pid <= 0 {
		t.Errorf("exec after the second resume: %d, %v", pid, err)
	}
}
