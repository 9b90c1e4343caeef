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
