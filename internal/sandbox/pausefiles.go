package sandbox

import (
	"context"
	"fmt"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// PauseFiles pauses a running sandbox keeping only its files (E2B's
// pause({keepMemory: false})): its writable layer is saved as a files
// snapshot, its instance is ended, and a fresh instance boots from the
// template with those files restored, then is paused. Resume thaws that
// fresh boot: the files are kept, processes and memory are not (a new
// boot id). The work happens here rather than at the resume, so a resume
// is as quick as any; the paused fresh instance holds the little memory of
// a new boot.
//
// Errors: ErrConflict (not running), ErrNotSupported (the driver cannot
// pause or export its files, or snapshots are off), ErrUnavailable. A
// failure before the old instance is ended leaves the sandbox running as
// it was; one after (the fresh boot or the restore failed) destroys the
// sandbox, whose files stay in the snapshot it names in its reason.
func (s *Service) PauseFiles(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return sb, err
	}
	if s.snaps == nil {
		return sb, errdefs.NotSupported("snapshots are not enabled on this server: a files-only pause needs them")
	}
	d := s.drivers[sb.Driver]
	if !d.Capabilities().Has(driver.CapPause) || !d.Capabilities().Has(driver.CapFilesSnapshot) {
		return sb, errdefs.NotSupported("driver %s cannot pause keeping only the files", sb.Driver)
	}
	tpl, err := s.store.GetTemplate(ctx, sb.Template)
	if err != nil {
		return sb, err
	}
	if tpl.Digest != sb.TemplateDigest {
		return sb, errdefs.Conflict("template %s was rebuilt since sandbox %s was made: it cannot boot afresh from it (pause it keeping its memory)", sb.Template, id)
	}
	l.lockOp()
	defer l.opMu.Unlock()
	ctx = context.WithoutCancel(ctx)
	if cur, err := s.store.GetSandbox(ctx, id); err != nil || cur.State != StateRunning {
		if err == nil {
			err = stateConflict(cur.State, "sandbox %s is %s", id, cur.State)
		}
		return cur, err
	}
	sn, err := s.takeSnapshot(ctx, sb, KindFiles, "", true)
	if err != nil {
		return sb, err
	}
	defer s.pinSnapshot(sn.ID)()
	log := s.log.With("sandbox", id)

	// From here the old instance is gone: a failure destroys the sandbox.
	s.mu.Lock()
	if s.live[id] == l {
		delete(s.live, id) // its watch then knows the end is the service's
	}
	s.mu.Unlock()
	l.agent.Close()
	if err := l.inst.Destroy(ctx); err != nil {
		log.Warn("files-only pause: ending the old instance", "err", err)
	}
	fail := func(undo func() error, cause error) (store.Sandbox, error) {
		if undo != nil {
			_ = undo()
		}
		s.mu.Lock()
		cur := s.live[id]
		s.mu.Unlock()
		reason := fmt.Sprintf("files-only pause failed (its files are in snapshot %s): %v", sn.ID, cause)
		_ = s.destroy(ctx, id, cur, reason)
		log.Warn("files-only pause failed; sandbox destroyed", "snapshot", sn.ID, "err", cause)
		return sb, fmt.Errorf("pause: %v: %w", cause, errdefs.ErrUnavailable)
	}
	inst, agent, undo, err := s.boot(ctx, sb, tpl, false)
	if err != nil {
		return fail(nil, err)
	}
	if err := s.initAgent(ctx, sb, agent, agentproto.InitRequest{}, false); err != nil {
		return fail(undo, fmt.Errorf("sandbox agent did not come up: %w", err))
	}
	nl := &live{inst: inst, agent: agent}
	s.mu.Lock()
	s.live[id] = nl
	s.mu.Unlock()
	s.watch(id, nl, nil)
	if _, err := s.RestoreFiles(ctx, c, id, sn.ID, nil); err != nil {
		return fail(nil, fmt.Errorf("restore the files: %w", err))
	}
	nl.lockOp()
	defer nl.opMu.Unlock()
	if err := s.store.UpdateSandboxState(ctx, id, []string{StateRunning}, StatePaused, ""); err != nil {
		return sb, s.asStateError(ctx, id, err)
	}
	if err := inst.Pause(ctx); err != nil {
		// Running, freshly booted with its files: a pause that did not
		// happen, of a sandbox that lost its memory anyway.
		_ = s.store.UpdateSandboxState(ctx, id, []string{StatePaused}, StateRunning, "")
		return sb, fmt.Errorf("pause: %v: %w", err, errdefs.ErrUnavailable)
	}
	log.Info("sandbox paused keeping only its files", "snapshot", sn.ID)
	return s.store.GetSandbox(ctx, id)
}
