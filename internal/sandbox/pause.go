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
	if s.onPause != nil {
		s.onPause(ctx, sb) // the rolling history's checkpoint, taken while it is still live
	}
	if err := l.inst.Pause(ctx); err != nil {
		_ = s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, "")
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
	if err := l.inst.Resume(ctx); err != nil {
		return sb, fmt.Errorf("resume: %v: %w", err, errdefs.ErrUnavailable)
	}
	if err := s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, ""); err != nil {
		return sb, s.asStateError(ctx, id, err)
	}
	if sb.ExpiresAt.IsZero() && sb.TimeoutS > 0 {
		// Paused by its timeout: a new period starts now.
		_ = s.store.SetSandboxExpiry(ctx, id, s.now().UTC().Add(time.Duration(sb.TimeoutS)*time.Second))
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
