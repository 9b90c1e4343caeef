package sandbox

import (
	"testing"
	"time"
)

// TestAfterBurstQuiet: a refill that is not urgent waits until no request
// reached a sandbox for the quiet period, but never past its limit, and
// one that is urgent (quiet 0) does not wait for requests at all.
func TestAfterBurstQuiet(t *testing.T) {
	s := &Service{}
	const quiet = 100 * time.Millisecond

	s.lastUse.Store(time.Now().UnixNano())
	start := time.Now()
	s.afterBurst(nil, 10*time.Second, quiet)
	if d := time.Since(start); d < quiet-5*time.Millisecond {
		t.Errorf("returned %v after a request; want ≥ %v of quiet", d, quiet)
	}

	// Urgent: requests do not hold it (only the create burst gap does);
	// were they to, this would wait for an hour.
	s.lastUse.Store(time.Now().UnixNano())
	s.afterBurst(nil, time.Hour, 0)

	// A steady stream of requests holds it only until the limit.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				s.lastUse.Store(time.Now().UnixNano())
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		s.afterBurst(nil, 300*time.Millisecond, quiet)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a steady stream of requests held the refill past its limit")
	}

	// Waking it ends the wait.
	wake := make(chan struct{})
	close(wake)
	s.afterBurst(wake, time.Hour, time.Hour)
}

// TestAdaptTarget: the target follows the claim rate of the last 30 s
// (claims expected while one sandbox boots, twice over), from the base
// size up to the maximum; a lone claim does not grow it.
func TestAdaptTarget(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		claims int
		boot   time.Duration
		want   int64
	}{
		{0, time.Second, 2},
		{1, time.Second, 2},      // 2 × 1/30 × 1 s ≈ 0.07
		{1, 2 * time.Second, 2},  // ≈ 0.13
		{20, 2 * time.Second, 5}, // 2 × 20/30 × 2 s ≈ 2.7
		{60, 3 * time.Second, 8}, // 12, capped at max
		{30, 500 * time.Millisecond, 3},
	} {
		p := &pool{base: 2, max: 8, boot: c.boot}
		for i := 0; i < c.claims; i++ {
			p.demand = append(p.demand, now.Add(-time.Duration(c.claims-i)*100*time.Millisecond))
		}
		p.demand = append([]time.Time{now.Add(-time.Minute)}, p.demand...) // too old to count
		p.adapt()
		if got := p.target.Load(); got != c.want {
			t.Errorf("%d claims, boot %v: target %d, want %d", c.claims, c.boot, got, c.want)
		}
	}
}
