package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestQuotaCRUD(t *testing.T) { forBackends(t, testQuotaCRUD) }

func testQuotaCRUD(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if _, err := s.GetQuota(ctx, "t1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetQuota of a team without one: %v", err)
	}
	if err := s.PutQuota(ctx, "t1", Quota{MaxSandboxes: 3, MaxMemoryMB: 1024}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutQuota(ctx, "t1", Quota{MaxSandboxes: 4, MaxSnapshotMB: 2048}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.GetQuota(ctx, "t1"); err != nil || q != (Quota{MaxSandboxes: 4, MaxSnapshotMB: 2048}) {
		t.Fatalf("GetQuota = %+v, %v; want the replaced quota", q, err)
	}
	for _, q := range []Quota{{MaxSandboxes: -1}, {MaxSnapshotMB: -1}} {
		if err := s.PutQuota(ctx, "t1", q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("negative limit %+v: %v", q, err)
		}
	}
	if err := s.DeleteQuota(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteQuota(ctx, "t1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestQuotaCreate(t *testing.T) { forBackends(t, testQuotaCreate) }

func testQuotaCreate(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	q := Quota{MaxSandboxes: 2, MaxMemoryMB: 1536}
	for i, state := range []string{"running", "paused"} {
		if err := s.CreateSandboxWithin(ctx, newSandbox(fmt.Sprint("sb", i), "t1", state), q); err != nil {
			t.Fatalf("create %d within the quota: %v", i, err)
		}
	}
	err := s.CreateSandboxWithin(ctx, newSandbox("sb2", "t1", "creating"), q)
	if !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("third sandbox of a team allowed two: %v", err)
	}
	t.Logf("refused: %v", err)
	// Other teams, stopped and pooled sandboxes do not count.
	if err := s.CreateSandboxWithin(ctx, newSandbox("other", "t2", "running"), q); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateSandboxState(ctx, "sb1", []string{"paused"}, StateStopped, "killed"); err != nil {
		t.Fatal(err)
	}
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (Usage{Sandboxes: 1, MemoryMB: 512, CPU: 2}) {
		t.Fatalf("usage = %+v, %v", u, err)
	}
	// The memory limit: 512 held, 1536 allowed, 1024 more does not fit.
	big := newSandbox("big", "t1", "creating")
	big.MemoryMB = 1100
	if err := s.CreateSandboxWithin(ctx, big, q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("memory over the quota: %v", err)
	}
	big.MemoryMB = 1024
	if err := s.CreateSandboxWithin(ctx, big, q); err != nil {
		t.Fatalf("memory exactly at the quota: %v", err)
	}
	// An existing id is still a conflict, not a quota error.
	if err := s.CreateSandboxWithin(ctx, newSandbox("other", "t2", "running"), q); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := s.CheckQuota(ctx, "t1", 1, Size{}, q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("CheckQuota at the limit: %v", err)
	}
	if err := s.CheckQuota(ctx, "t2", 2, Size{CPU: 2, MemoryMB: 512}, q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("CheckQuota of two more with room for one: %v", err)
	}
	if err := s.CheckQuota(ctx, "t2", 1, Size{CPU: 2, MemoryMB: 512}, q); err != nil {
		t.Fatalf("CheckQuota with room: %v", err)
	}
}

// A sandbox left in state error (its instance could not be destroyed, so
// it may still hold memory and CPUs) counts against its team's quota until
// it stops.
func TestQuotaCountsError(t *testing.T) { forBackends(t, testQuotaCountsError) }

func testQuotaCountsError(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	q := Quota{MaxSandboxes: 2}
	for i := range 2 {
		if err := s.CreateSandboxWithin(ctx, newSandbox(fmt.Sprint("sb", i), "t1", "creating"), q); err != nil {
			t.Fatalf("create %d of 2: %v", i, err)
		}
	}
	if err := s.UpdateSandboxState(ctx, "sb0", []string{"creating"}, "error", "destroy failed"); err != nil {
		t.Fatal(err)
	}
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (Usage{Sandboxes: 2, MemoryMB: 1024, CPU: 4}) {
		t.Fatalf("usage with one sandbox in error = %+v, %v", u, err)
	}
	if err := s.CreateSandboxWithin(ctx, newSandbox("sb2", "t1", "creating"), q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("third sandbox while one of two is in error: %v", err)
	}
	if err := s.UpdateSandboxState(ctx, "sb0", []string{"error"}, StateStopped, "killed"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandboxWithin(ctx, newSandbox("sb2", "t1", "creating"), q); err != nil {
		t.Fatalf("once the one in error stopped: %v", err)
	}
}

// A refusal is explained by what the refused write saw: a sandbox of the
// team that stops right after the write (injected at beforeRefusal) must
// not turn the quota error into a 500 for a create or into "not pooled"
// for a claim (whose warm sandbox the service would then destroy).
func TestQuotaRefusalConsistent(t *testing.T) { forBackends(t, testQuotaRefusalConsistent) }

func testQuotaRefusalConsistent(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	createPooled(t, s, 1)
	q := Quota{MaxSandboxes: 1}
	var stopping string // the sandbox the hook stops
	stopped := make(chan error, 1)
	beforeRefusal = func() {
		go func() { stopped <- s.UpdateSandboxState(context.Background(), stopping, nil, StateStopped, "killed") }()
		// Give the stop its chance: it waits while the refused write's
		// transaction holds the writer.
		select {
		case err := <-stopped:
			stopped <- err
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Cleanup(func() { beforeRefusal = nil })
	for i, try := range []func(Quota) error{
		func(q Quota) error { return s.CreateSandboxWithin(ctx, newSandbox("new", "t1", "creating"), q) },
		func(q Quota) error { return s.ClaimSandboxWithin(ctx, newSandbox("pool0", "t1", "running"), q) },
	} {
		stopping = fmt.Sprint("held", i)
		if err := s.CreateSandboxWithin(ctx, newSandbox(stopping, "t1", "running"), q); err != nil {
			t.Fatal(err)
		}
		err := try(q)
		if !errors.Is(err, errdefs.ErrQuotaExceeded) {
			t.Errorf("write %d refused at the quota, a sandbox stopping meanwhile: %v, want the quota error", i, err)
		}
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
	}
	if sb, err := s.GetSandbox(ctx, "pool0"); err != nil || sb.State != "pooled" {
		t.Errorf("refused claim left %+v, %v", sb, err)
	}
}

// TestQuotaCPU: the CPUs a team's live sandboxes hold together are
// limited like their memory, for creates and claims alike; the error says
// which limit.
func TestQuotaCPU(t *testing.T) { forBackends(t, testQuotaCPU) }

func testQuotaCPU(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	q := Quota{MaxCPU: 5}
	for i, state := range []string{"running", "paused"} { // 2 CPUs each
		if err := s.CreateSandboxWithin(ctx, newSandbox(fmt.Sprint("sb", i), "t1", state), q); err != nil {
			t.Fatalf("create %d within the quota: %v", i, err)
		}
	}
	err := s.CreateSandboxWithin(ctx, newSandbox("sb2", "t1", "creating"), q)
	if !errors.Is(err, errdefs.ErrQuotaExceeded) || !strings.Contains(err.Error(), "4 of its 5 CPUs; 2 more") {
		t.Fatalf("2 CPUs more with 1 left: %v", err)
	}
	if err := s.CreateSandbox(ctx, newSandbox("pool0", "-pool", "pooled")); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimSandboxWithin(ctx, newSandbox("pool0", "t1", "running"), q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("claim of 2 CPUs with 1 left: %v", err)
	}
	one := newSandbox("one", "t1", "creating")
	one.CPU = 1
	if err := s.CreateSandboxWithin(ctx, one, q); err != nil {
		t.Fatalf("1 CPU with 1 left: %v", err)
	}
	if err := s.CheckQuota(ctx, "t1", 1, Size{CPU: 1}, q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("CheckQuota at the limit: %v", err)
	}
	if u, _ := s.TeamUsage(ctx, "t1"); u != (Usage{Sandboxes: 3, MemoryMB: 1536, CPU: 5}) {
		t.Fatalf("usage %+v", u)
	}
	if err := s.PutQuota(ctx, "t1", Quota{MaxCPU: 8, MaxRPS: 3}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetQuota(ctx, "t1"); err != nil || got != (Quota{MaxCPU: 8, MaxRPS: 3}) {
		t.Fatalf("GetQuota = %+v, %v", got, err)
	}
}

// Concurrent creates and claims of one team never overshoot its quota.
func TestQuotaRace(t *testing.T) { forBackends(t, testQuotaRace) }

func testQuotaRace(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	createPooled(t, s, 10)
	q := Quota{MaxSandboxes: 7}
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				sb := newSandbox(fmt.Sprint("pool", i/2), "t1", "running")
				err = s.ClaimSandboxWithin(ctx, sb, q)
			} else {
				err = s.CreateSandboxWithin(ctx, newSandbox(fmt.Sprint("sb", i), "t1", "creating"), q)
			}
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrQuotaExceeded):
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 7 || refused.Load() != 13 {
		t.Fatalf("%d stored, %d refused; want 7 and 13", ok.Load(), refused.Load())
	}
	if u, _ := s.TeamUsage(ctx, "t1"); u.Sandboxes != 7 {
		t.Fatalf("usage %+v", u)
	}
}

// The quota count, done by every claim inside the one write transaction,
// reads the live-team index only, never the sandboxes' rows.
func TestUsageReadsIndexOnly(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	for _, q := range []string{usageSQL, `SELECT 1 WHERE ` + withinSQL} {
		n := strings.Count(q, "?")
		args := make([]any, n)
		for i := range args {
			args[i] = 1
		}
		args[n-1] = "team" // the team is the last argument of both
		rows, err := s.r.QueryContext(ctx, `EXPLAIN QUERY PLAN `+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if p := strings.Join(plan, "; "); !strings.Contains(p, "USING COVERING INDEX sandboxes_live_team") {
			t.Errorf("plan of %q:\n%s\nwant the covering index sandboxes_live_team", q, p)
		}
	}
}

// BenchmarkClaimWithin is one warm claim under a quota for a team already
// holding 1,000 live sandboxes (and those claimed before it: run it with
// -benchtime 500x): the claim counts them in its statement (SQLite) or
// under its team's quota lock (Postgres). One claim at a time: its
// latency.
func BenchmarkClaimWithin(b *testing.B) { benchBackends(b, benchClaimWithin) }

func benchClaimWithin(b *testing.B, open opener) {
	ctx := b.Context()
	s := open()
	for i := range 1000 {
		if err := s.CreateSandbox(ctx, newSandbox(fmt.Sprint("live", i), "t1", "running")); err != nil {
			b.Fatal(err)
		}
	}
	for i := range b.N {
		if err := s.CreateSandbox(ctx, newSandbox(fmt.Sprint("pool", i), "-pool", "pooled")); err != nil {
			b.Fatal(err)
		}
	}
	q := Quota{MaxSandboxes: 1 << 30}
	b.ResetTimer()
	for i := range b.N {
		if err := s.ClaimSandboxWithin(ctx, newSandbox(fmt.Sprint("pool", i), "t1", "running"), q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimsConcurrent is warm claims under a quota from 16
// goroutines over two Stores on one database (two replicas; on SQLite two
// processes' worth of writers on one file), each claim its own team's
// (teams spread the quota locks): claims/s is the throughput the store
// alone gives a burst of warm creates.
func BenchmarkClaimsConcurrent(b *testing.B) { benchBackends(b, benchClaimsConcurrent) }

func benchClaimsConcurrent(b *testing.B, open opener) {
	ctx := b.Context()
	replicas := []*Store{open(), open()}
	for i := range b.N {
		if err := replicas[0].CreateSandbox(ctx, newSandbox(fmt.Sprint("pool", i), "-pool", "pooled")); err != nil {
			b.Fatal(err)
		}
	}
	q := Quota{MaxSandboxes: 1 << 30}
	var next atomic.Int64
	b.SetParallelism(8) // 16 goroutines on 2 cores
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1) - 1
			sb := newSandbox(fmt.Sprint("pool", i), fmt.Sprint("t", i%8), "running")
			if err := replicas[i%2].ClaimSandboxWithin(ctx, sb, q); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "claims/s")
}

// TestDiskQuota: a sandbox's disk reservation is stored, counted in its
// team's usage while it lives and limited by MaxDiskMB, at the insert (so
// concurrent creates cannot overshoot) and in CheckQuota, with a message
// naming the disk; the quota round-trips. Rows from before the column read
// as the 10 GiB the drivers reserved then.
func TestDiskQuota(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	q := Quota{MaxDiskMB: 6000}
	if err := s.PutQuota(ctx, "t1", q); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetQuota(ctx, "t1"); err != nil || got != q {
		t.Fatalf("quota round trip: %+v %v", got, err)
	}
	if err := s.PutQuota(ctx, "t1", Quota{MaxDiskMB: -1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("negative disk quota: %v", err)
	}
	a := newSandbox("a", "t1", "running")
	a.DiskMB = 4096
	if err := s.CreateSandboxWithin(ctx, a, q); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "a"); err != nil || got.DiskMB != 4096 {
		t.Fatalf("stored disk_mb: %d %v", got.DiskMB, err)
	}
	b := newSandbox("b", "t1", "creating")
	b.DiskMB = 2048
	err := s.CreateSandboxWithin(ctx, b, q)
	if !errors.Is(err, errdefs.ErrQuotaExceeded) || !strings.Contains(err.Error(), "4096 of its 6000 MiB of sandbox disk") {
		t.Fatalf("disk over the quota: %v", err)
	}
	if err := s.CheckQuota(ctx, "t1", 1, SizeOf(b), q); !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Errorf("CheckQuota over the disk quota: %v", err)
	}
	b.DiskMB = 1904
	if err := s.CreateSandboxWithin(ctx, b, q); err != nil {
		t.Fatalf("disk exactly at the quota: %v", err)
	}
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u.DiskMB != 6000 {
		t.Fatalf("usage %+v %v", u, err)
	}
	// A stopped sandbox no longer holds its disk.
	if err := s.UpdateSandboxState(ctx, "a", []string{"running"}, StateStopped, "killed"); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.TeamUsage(ctx, "t1"); u.DiskMB != 1904 {
		t.Errorf("usage after a stop: %+v", u)
	}
	// A row written before disk_mb existed.
	if _, err := s.w.ExecContext(ctx, `INSERT INTO sandboxes(id, team, template, template_digest, driver, state, reason, env, metadata, cpu, memory_mb, timeout_s, on_timeout, created_at, updated_at, expires_at)
		VALUES ('old', 't2', 'base', '', 'gvisor', 'running', '', '{}', '{}', 1, 512, 300, 'kill', 1, 1, 0)`); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "old"); err != nil || got.DiskMB != 10240 {
		t.Errorf("an old row's disk_mb: %d %v", got.DiskMB, err)
	}
}
