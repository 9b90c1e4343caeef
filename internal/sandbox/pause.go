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
//
// The freeze comes first and the call returns once it is done: nothing
// the sandbox does after the answer happens. The rolling history's
// checkpoint (Snapshots.CheckpointOnPause) is then taken of the frozen
// sandbox in the background: its timeline entry is "creating" when Pause
// answers and becomes ready (or failed, which leaves the sandbox paused)
// once stored. The sandbox's operation lock is held until then, so a
// Resume or a kill waits for the checkpoint and comes after it.
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
	unlock := l.opMu.Unlock // nil once the background checkpoint owns the lock
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	ctx = context.WithoutCancel(ctx)
	// Another pause (or a kill) may have run while this one waited for
	// the lock: the freeze below must not follow it.
	if cur, err := s.store.GetSandbox(ctx, id); err == nil && cur.State != StateRunning {
		return cur, stateConflict(cur.State, "sandbox %s is %s", id, cur.State)
	}
	checkpoint := s.snaps != nil && s.snaps.CheckpointOnPause
	var exportErr error
	if checkpoint {
		if _, ok := l.inst.(driver.UpperExporter); ok {
			// Asked before the freeze, since a frozen agent cannot
			// answer (one round trip for its disk and memory use).
			exportErr = s.checkExport(ctx, sb, l)
		}
	}
	freezeStart := s.now()
	if err := l.inst.Pause(ctx); err != nil {
		return sb, fmt.Errorf("pause: %v: %w", err, errdefs.ErrUnavailable)
	}
	frozen := s.now()
	thaw := func() {
		if err := l.inst.Resume(ctx); err != nil {
			s.log.Error("resume after a failed pause", "sandbox", id, "err", err)
		}
	}
	// The checkpoint's timeline entry is recorded before the state says
	// paused: whoever sees the sandbox paused finds it there.
	var p *pendingSnapshot
	if checkpoint {
		var err error
		if p, err = s.beginSnapshot(ctx, sb, l, KindCheckpoint, "", true, snapCause{}); err != nil {
			s.log.Warn("checkpoint on pause not taken", "sandbox", id, "err", err)
		}
	}
	abort := func(err error) {
		if p != nil {
			_, _ = p.fail(ctx, fmt.Errorf("the pause failed: %w", err))
		}
		thaw()
	}
	if err := s.store.UpdateSandboxState(ctx, id, []string{StateRunning}, StatePaused, ""); err != nil {
		abort(err)
		return sb, s.asStateError(ctx, id, err)
	}
	if timedOut {
		if err := s.store.ClearExpiryIfPaused(ctx, id); err != nil {
			_ = s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, "")
			abort(err) // still expired: the reaper tries again
			return sb, err
		}
	}
	if p != nil {
		s.checkpointPaused(ctx, p, exportErr, &unlock)
	}
	out, err := s.store.GetSandbox(ctx, id)
	s.log.Info("sandbox paused", "sandbox", id, "timed_out", timedOut,
		"freeze_ms", frozen.Sub(freezeStart).Milliseconds(), "after_freeze_ms", s.now().Sub(frozen).Milliseconds())
	return out, err
}

// checkpointPaused stores the rolling history's checkpoint p of a sandbox
// just frozen (and recorded paused) in the background, which takes over
// the operation lock (*unlock becomes nil) and releases it when done.
// exportErr, found before the freeze, fails it at once.
func (s *Service) checkpointPaused(ctx context.Context, p *pendingSnapshot, exportErr error, unlock *func()) {
	if exportErr != nil {
		_, _ = p.fail(ctx, exportErr)
		return
	}
	release := *unlock
	if !s.background(func() {
		defer release()
		start := s.now()
		if _, err := p.finish(s.bg); err == nil {
			s.log.Info("checkpoint of the paused sandbox stored", "sandbox", p.sb.ID, "snapshot", p.rec.ID, "ms", s.now().Sub(start).Milliseconds())
		}
	}) {
		_, _ = p.fail(ctx, errdefs.Unavailable("the server is shutting down"))
		return
	}
	*unlock = nil
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
