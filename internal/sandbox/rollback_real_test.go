package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// flakyDriver is the real gVisor driver with failures injected: the next
// failStart instances report a failed Start after really starting, and
// the next failDestroy destroys fail without doing anything.
type flakyDriver struct {
	driver.Driver
	failStart, failDestroy, failRecover atomic.Int32
}

// DestroyHandle forwards driver.HandleDestroyer.
func (d *flakyDriver) DestroyHandle(ctx context.Context, h driver.Handle) error {
	return d.Driver.(driver.HandleDestroyer).DestroyHandle(ctx, h)
}

// Recover fails without an answer (as a runsc that timed out) the next
// failRecover times.
func (d *flakyDriver) Recover(ctx context.Context, h driver.Handle) (driver.Instance, error) {
	if d.failRecover.Add(-1) >= 0 {
		return nil, errdefs.Unavailable("injected: runsc state timed out")
	}
	return d.Driver.Recover(ctx, h)
}

func (d *flakyDriver) Create(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
	inst, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &flakyInstance{Instance: inst, d: d}, nil
}

type flakyInstance struct {
	driver.Instance
	d *flakyDriver
}

func (i *flakyInstance) Start(ctx context.Context) error {
	if err := i.Instance.Start(ctx); err != nil {
		return err
	}
	if i.d.failStart.Add(-1) >= 0 {
		return errors.New("injected: start failed")
	}
	return nil
}

// Detach forwards driver.Detacher (a server's shutdown closes the
// instance's listener; without it the agent kept talking to the old one).
func (i *flakyInstance) Detach() {
	if dt, ok := i.Instance.(driver.Detacher); ok {
		dt.Detach()
	}
}

func (i *flakyInstance) Destroy(ctx context.Context) error {
	if i.d.failDestroy.Add(-1) >= 0 {
		return errors.New("injected: destroy failed")
	}
	return i.Instance.Destroy(ctx)
}

// TestCreateRollbackKeepsWhatItCannotDestroy: a create that fails after
// its sandbox started, and whose rollback cannot destroy the instance,
// keeps the record in state error (with its handle and the reason)
// instead of deleting it, so the still running sandbox is listed and a
// kill destroys it for real. The record was deleted, and the sandbox ran
// on with nothing that would ever stop it.
func TestCreateRollbackKeepsWhatItCannotDestroy(t *testing.T) {
	fd := &flakyDriver{}
	svc, st, _ := realServiceWith(t, func(d driver.Driver) driver.Driver { fd.Driver = d; return fd })
	ctx := context.Background()
	c := Caller{Team: "t"}
	fd.failStart.Store(1)
	fd.failDestroy.Store(1)
	if _, err := svc.Create(ctx, c, CreateRequest{}); err == nil || !strings.Contains(err.Error(), "could not be destroyed") {
		t.Fatalf("create with a failed start and rollback: %v, want the error naming both", err)
	}
	list, _, err := svc.List(ctx, c, ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].State != StateError || !strings.Contains(list[0].Reason, "injected: destroy failed") {
		t.Fatalf("sandboxes after the failed create: %+v, want one in state error saying why", list)
	}
	id := list[0].ID
	sb, err := st.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var h driver.Handle
	if err := json.Unmarshal(sb.Handle, &h); err != nil {
		t.Fatalf("the kept record has no handle: %v", err)
	}
	if _, err := fd.Driver.Recover(ctx, h); err != nil {
		t.Fatalf("the left-behind instance is not running (so nothing was left behind?): %v", err)
	}
	if err := svc.Kill(ctx, c, id); err != nil {
		t.Fatalf("kill the left-behind sandbox: %v", err)
	}
	if _, err := fd.Driver.Recover(ctx, h); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after the kill the instance is still there: %v", err)
	}

	// A create whose rollback does destroy leaves no record.
	fd.failStart.Store(1)
	if _, err := svc.Create(ctx, c, CreateRequest{}); err == nil {
		t.Fatal("create with a failed start succeeded")
	}
	list, _, _ = svc.List(ctx, c, ListOptions{States: []string{StateCreating, StateRunning, StateError}})
	if len(list) != 0 {
		t.Errorf("sandboxes after a failed create that rolled back: %+v", list)
	}
}

// TestClaimOverQuotaGivesWarmBack: a claim that loses its team's quota race
// (creates that all passed the advisory check, one place left) gives the
// warm sandbox back to its pool, untouched and still the next claim's;
// it was destroyed, so a team at its quota could empty every pool (and
// keep all teams on cold creates) with bursts of creates.
func TestClaimOverQuotaGivesWarmBack(t *testing.T) {
	svc, st, tpl := realService(t)
	ctx := context.Background()
	svc.StartPool(ctx, tpl, PoolConfig{Template: "base", Size: 1})
	waitUntil(t, "the pool to fill", func() bool { return svc.PoolReady()["base"] == 1 })
	c := Caller{Team: "t"}
	if _, err := svc.Create(ctx, c, CreateRequest{}); err != nil { // the team's one place
		t.Fatal(err)
	}
	waitUntil(t, "the pool to refill", func() bool { return svc.PoolReady()["base"] == 1 })
	var p *pool
	for _, q := range svc.poolSet().byKey {
		p = q
	}
	w := p.take()
	if w == nil {
		t.Fatal("no warm sandbox to take")
	}
	now := svc.now().UTC()
	want := store.Sandbox{Team: "t", Env: map[string]string{}, Metadata: map[string]string{}, TimeoutS: 300, OnTimeout: "kill", CreatedAt: now, ExpiresAt: now.Add(5 * time.Minute)}
	if _, err := svc.claim(ctx, c, want, CreateRequest{Network: &NetworkSpec{Allow: []string{"example.com"}}}, p, w, store.Quota{MaxSandboxes: 1}); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("a claim past the quota: %v", err)
	}
	if got := pooledIDs(t, st); got[w.sb.ID] == "" {
		t.Fatalf("pooled after the refused claim: %v, want %s back", got, w.sb.ID)
	}
	if _, err := st.GetNetwork(ctx, w.sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the refused claim's network record stayed: %v", err)
	}
	// The take made the pool refill meanwhile: the given-back sandbox
	// waits behind the refill and is one of the next two claims.
	var got []string
	for range 2 {
		sb, err := svc.Create(ctx, c, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, sb.ID)
		if sb.ID == w.sb.ID {
			if code := exitCode(t, svc, sb.ID, "true"); code != 0 {
				t.Errorf("exec in the given-back sandbox: exit %d", code)
			}
		}
	}
	if got[0] != w.sb.ID && got[1] != w.sb.ID {
		t.Errorf("the next creates got %v, not the warm sandbox given back (%s)", got, w.sb.ID)
	}
}

// TestRecoverUnsureLeavesSandboxRunning: a restarted server whose driver
// cannot tell whether a sandbox lives (a runsc that timed out) leaves it
// running, answers 503 "not attached yet" and re-attaches it in the
// background; one stopped during its start-up recovery (a cancelled
// context) leaves every sandbox as it was for the next start. Both were
// destroyed (runsc delete) and marked stopped.
func TestRecoverUnsureLeavesSandboxRunning(t *testing.T) {
	fd := &flakyDriver{}
	svc, st, _ := realServiceWith(t, func(d driver.Driver) driver.Driver { fd.Driver = d; return fd })
	ctx := context.Background()
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Runs before realServiceWith's cleanup kills what is left: a failing
	// run must not leave its sandbox to an injected failure.
	t.Cleanup(func() { fd.failRecover.Store(0) })
	if _, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	svc.Shutdown() // detaches; the sandbox runs on
	restart := func() *Service {
		s2 := New(svc.cfg, st, []driver.Driver{fd}, svc.log, NewMetrics(prometheus.NewRegistry(), st.CountSandboxesByState))
		t.Cleanup(s2.Shutdown)
		return s2
	}
	alive := func(when string) {
		t.Helper()
		rec, err := st.GetSandbox(ctx, sb.ID)
		if err != nil || rec.State != StateRunning {
			t.Fatalf("%s: record %+v %v, want running", when, rec, err)
		}
		var h driver.Handle
		if err := json.Unmarshal(rec.Handle, &h); err != nil {
			t.Fatal(err)
		}
		inst, err := fd.Driver.Recover(ctx, h)
		if err != nil {
			t.Fatalf("%s: the instance is gone: %v", when, err)
		}
		inst.(driver.Detacher).Detach() // its listener would take the agent's next connection
	}

	// Stopped during recovery.
	s2 := restart()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s2.Recover(cctx); err == nil {
		t.Fatal("a recovery with a cancelled context reported success")
	}
	alive("after a recovery cut short")
	s2.Shutdown()

	// The driver cannot tell, once.
	s3 := restart()
	fd.failRecover.Store(1)
	if err := s3.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	alive("after an unsure recovery")
	if _, err := s3.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("exec before the background retry: %v, want unavailable", err)
	}
	waitUntil(t, "the background retry to re-attach the sandbox", func() bool {
		_, err := s3.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}})
		return err == nil
	})
	s3.Shutdown()

	// The driver never answers: a kill still ends the sandbox (what its
	// handle names is destroyed without asking); it was marked error and
	// could never be killed.
	s4 := restart()
	fd.failRecover.Store(1 << 20)
	if err := s4.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s4.Kill(ctx, c, sb.ID); err != nil {
		t.Fatalf("kill of a sandbox its driver cannot tell the state of: %v", err)
	}
	fd.failRecover.Store(0)
	rec, _ := st.GetSandbox(ctx, sb.ID)
	var h driver.Handle
	json.Unmarshal(rec.Handle, &h)
	if _, err := fd.Driver.Recover(ctx, h); !errors.Is(err, errdefs.ErrNotFound) || rec.State != StateStopped {
		t.Errorf("after the kill: record %s, instance %v", rec.State, err)
	}
}
