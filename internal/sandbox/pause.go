package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Pause freezes every process of a running sandbox: it uses no CPU until
// Resume, and its processes, memory and files stay exactly as they were.
// Pausing a paused sandbox is a 409 with the current state.
func (s *Service) Pause(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	return s.pause(ctx, c, id, false)
}

// pause is Pause; timedOut (the reaper pausing a sandbox whose timeout
// says pause) clears its expiry in the same operation, so a Resume, which
// waits for it, starts a new timeout period.
func (s *Service) pause(ctx context.Context, c Caller, id string, timedOut bool) (store.Sandbox, error) {
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return sb, err
	}
	if !s.drivers[sb.Driver].Capabilities().Has(driver.CapPause) {
		return sb, errdefs.NotSupported("driver %s cannot pause", sb.Driver)
	}
	l.lockOp()
	defer l.opMu.Unlock()
	ctx = context.WithoutCancel(ctx)
	if err := s.store.UpdateSandboxState(ctx, id, []string{StateRunning}, StatePaused, ""); err != nil {
		return sb, s.asStateError(ctx, id, err)
	}
	if timedOut {
		if err := s.store.ClearExpiryIfPaused(ctx, id); err != nil {
			_ = s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, "")
			return sb, err
		}
	}
	if s.onPause != nil {
		s.onPause(ctx, sb) // the rolling history's checkpoint, taken while it is still live
	}
	if err := l.inst.Pause(ctx); err != nil {
		_ = s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, "")
		if timedOut {
			_ = s.store.SetSandboxExpiry(ctx, id, sb.ExpiresAt) // still expired: the reaper tries again
		}
		return sb, fmt.Errorf("pause: %v: %w", err, errdefs.ErrUnavailable)
	}
	s.log.Info("sandbox paused", "sandbox", id)
	return s.store.GetSandbox(ctx, id)
}

// Resume thaws a paused sandbox.
func (s *Service) Resume(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	sb, l, err := s.liveOf(ctx, c, id, StatePaused)
	if err != nil {
		return sb, err
	}
	l.lockOp()
	defer l.opMu.Unlock()
	ctx = context.WithoutCancel(ctx)
	// Another resume may have run while this one waited for the lock:
	// answer 409 with the state it left, as for a sandbox never paused.
	if cur, err := s.store.GetSandbox(ctx, id); err == nil && cur.State != StatePaused {
		return cur, stateConflict(cur.State, "sandbox %s is %s", id, cur.State)
	}
	if err := l.inst.Resume(ctx); err != nil {
		return sb, fmt.Errorf("resume: %v: %w", err, errdefs.ErrUnavailable)
	}
	if err := s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, ""); err != nil {
		return sb, s.asStateError(ctx, id, err)
	}
	if cur, err := s.store.GetSandbox(ctx, id); err == nil && cur.TimeoutS > 0 && (cur.ExpiresAt.IsZero() || !cur.ExpiresAt.After(s.now())) {
		// Paused by its timeout (or its expiry passed while paused): a new
		// period starts now. Read under the operation lock: a timeout pause
		// clears the expiry inside it.
		_ = s.store.SetSandboxExpiry(ctx, id, s.now().UTC().Add(time.Duration(cur.TimeoutS)*time.Second))
	}
	s.log.Info("sandbox resumed", "sandbox", id)
	return s.store.GetSandbox(ctx, id)
}

// asStateError turns the store's conflict into a ConflictError that names
// the current state.
func (s *Service) asStateError(ctx context.Context, id string, err error) error {
	if !isConflict(err) {
		return err
	}
	if sb, gerr := s.store.GetSandbox(ctx, id); gerr == nil {
		return stateConflict(sb.State, "sandbox %s is %s", id, sb.State)
	}
	return err
}
