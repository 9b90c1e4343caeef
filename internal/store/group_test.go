package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Claims that arrive together share transactions and keep their meaning:
// each pooled sandbox goes to one caller, and the team's quota holds across
// the claims of one transaction.
func TestGroupedClaims(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	createPooled(t, s, 40)
	q := Quota{MaxSandboxes: 30}
	// Hold the writer's one connection until claims have queued up: left
	// to the scheduler, a loaded host (a clean-clone CI run) ran the 80
	// goroutines one after another, each claim committed before the next
	// began, and nothing was grouped.
	hold, err := s.w.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ok, quota, taken atomic.Int32
	var wg sync.WaitGroup
	for i := range 80 { // every pooled sandbox claimed twice
		wg.Go(func() {
			err := s.ClaimSandboxWithin(ctx, newSandbox(fmt.Sprint("pool", i%40), "t1", "running"), q)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrQuotaExceeded):
				quota.Add(1)
			case errors.Is(err, errdefs.ErrConflict):
				taken.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.grouped.mu.Lock()
		queued, running := len(s.grouped.queue), s.grouped.running
		s.grouped.mu.Unlock()
		if queued >= 10 && running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims queued behind the held connection, want 10", queued)
		}
		time.Sleep(time.Millisecond)
	}
	hold.Close()
	wg.Wait()
	if ok.Load() != 30 || quota.Load()+taken.Load() != 50 {
		t.Fatalf("%d claimed, %d over the quota, %d already taken; want 30 and 50 refused", ok.Load(), quota.Load(), taken.Load())
	}
	if u, _ := s.TeamUsage(ctx, "t1"); u.Sandboxes != 30 {
		t.Fatalf("usage %+v", u)
	}
	if s.grouped.commits.Load() >= 80 {
		t.Errorf("80 concurrent claims took %d transactions: none were grouped", s.grouped.commits.Load())
	}
}

// A statement that fails fails its own caller only: the others of its
// transaction run again and commit.
func TestGroupedFailure(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	createPooled(t, s, 4)
	// Hold the writer's one connection: the first claim's transaction
	// waits for it, and the next writes queue up behind it as one group.
	hold, err := s.w.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.grouped.mu.Lock()
			got, running := len(s.grouped.queue), s.grouped.running
			s.grouped.mu.Unlock()
			if got == n && running {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d writes queued, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	errs := make([]error, 5)
	var wg sync.WaitGroup
	claim := func(i, slot int) {
		wg.Go(func() { errs[slot] = s.ClaimSandbox(ctx, newSandbox(fmt.Sprint("pool", i), "t1", "running")) })
	}
	claim(0, 0)
	queued(0) // taken by the first transaction, which waits for the connection
	claim(1, 1)
	queued(1)
	wg.Go(func() { _, errs[2] = s.grouped.exec(`UPDATE no_such_table SET x = 1`) })
	queued(2)
	claim(2, 3)
	queued(3)
	claim(3, 4)
	queued(4)
	hold.Close()
	wg.Wait()
	if errs[2] == nil {
		t.Error("a statement on a missing table succeeded")
	}
	for _, i := range []int{0, 1, 3, 4} {
		if errs[i] != nil {
			t.Errorf("claim in slot %d failed with its group: %v", i, errs[i])
		}
	}
	for i := range 4 {
		if sb, err := s.GetSandbox(ctx, fmt.Sprint("pool", i)); err != nil || sb.State != "running" || sb.Team != "t1" {
			t.Errorf("pool%d after the group: %+v %v", i, sb, err)
		}
	}
	// The first claim alone, the group that failed, the group again.
	if n := s.grouped.commits.Load(); n != 3 {
		t.Errorf("%d transactions, want 3", n)
	}
}

// createPooled records n pooled sandboxes, pool0 to pool<n-1>.
func createPooled(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := range n {
		if err := s.CreateSandbox(t.Context(), newSandbox(fmt.Sprint("pool", i), "-pool", "pooled")); err != nil {
			t.Fatal(err)
		}
	}
}
