package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// TestAllowRequest: a team with a limit gets a second's worth of requests
// at once and then ErrRateLimited, refills at its rate (never past a
// second's worth), and follows a change of its quota; other teams, admins
// and teams without a limit pass. The bounds hold however slow the host
// is: a slow loop only refills more, up to the burst.
func TestAllowRequest(t *testing.T) {
	ctx := context.Background()
	_, _, svc := historyService(t)
	svc.cfg.TeamQuota = store.Quota{MaxRPS: 0}
	if err := svc.SetQuota(ctx, Caller{Admin: true}, "t1", store.Quota{MaxRPS: 5}); err != nil {
		t.Fatal(err)
	}
	burst := func(c Caller, n int) (ok int, last error) {
		for range n {
			if last = svc.AllowRequest(ctx, c); last == nil {
				ok++
			}
		}
		return ok, last
	}
	if ok, err := burst(Caller{Team: "t1"}, 20); ok < 5 || ok == 20 || !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("20 at once at 5/s: %d passed, last %v", ok, err)
	}
	if ok, _ := burst(Caller{Team: "t2"}, 50); ok != 50 {
		t.Errorf("a team without a limit: %d of 50", ok)
	}
	if ok, _ := burst(Caller{Team: "t1", Admin: true}, 50); ok != 50 {
		t.Errorf("an admin key of the team: %d of 50", ok)
	}
	time.Sleep(450 * time.Millisecond) // ~2 tokens back, 5 at most
	if ok, _ := burst(Caller{Team: "t1"}, 10); ok < 1 || ok > 5 {
		t.Errorf("after 0.45 s at 5/s: %d passed", ok)
	}
	// A new limit applies at once, with a second's worth of its rate.
	if err := svc.SetQuota(ctx, Caller{Admin: true}, "t1", store.Quota{MaxRPS: 100}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := burst(Caller{Team: "t1"}, 10); ok != 10 {
		t.Errorf("after raising the limit to 100/s: %d of 10", ok)
	}
	if err := svc.DeleteQuota(ctx, Caller{Admin: true}, "t1"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := burst(Caller{Team: "t1"}, 300); ok != 300 {
		t.Errorf("back on the default (no limit): %d of 300", ok)
	}
	// The server's default applies to teams without a quota of their own.
	svc.cfg.TeamQuota = store.Quota{MaxRPS: 3}
	if ok, err := burst(Caller{Team: "t3"}, 10); ok < 3 || ok == 10 || !errors.Is(err, errdefs.ErrRateLimited) {
		t.Errorf("the default 3/s: %d of 10, last %v", ok, err)
	}
}
