package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Get returns one sandbox the caller owns.
func (s *Service) Get(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	return s.get(ctx, c, id)
}

// ListOptions filters List.
type ListOptions struct {
	States   []string
	Metadata map[string]string
	Limit    int
	Cursor   string
	// Templates, CreatedFrom and Newest are store.SandboxFilter's.
	Templates   []string
	CreatedFrom time.Time
	Newest      bool
}

// List returns the caller's sandboxes. Without a state filter, stopped
// sandboxes are left out.
func (s *Service) List(ctx context.Context, c Caller, o ListOptions) ([]store.Sandbox, string, error) {
	var states []string
	for _, st := range o.States {
		switch st {
		case StateCreating, StateRunning, StatePaused, StateStopping, StateStopped, StateError:
		default:
			return nil, "", errdefs.InvalidArgument("state: unknown state %q", st)
		}
		if !slices.Contains(states, st) {
			states = append(states, st)
		}
	}
	o.States = states // each once: a state repeated 33,000 times overran SQLite's variables (a 500)
	// A sandbox has at most 64 metadata entries; a filter on more keys
	// matches nothing, and a thousand of them overran SQLite's
	// expression depth (a 500).
	if len(o.Metadata) > 64 {
		return nil, "", errdefs.InvalidArgument("metadata: at most 64 filters")
	}
	for k, v := range o.Metadata {
		if !metaKeyRE.MatchString(k) || len(v) > 1024 {
			return nil, "", errdefs.InvalidArgument("metadata: invalid filter on %q", k)
		}
	}
	if len(o.States) == 0 {
		o.States = []string{StateCreating, StateRunning, StatePaused, StateStopping, StateError}
	}
	f := store.SandboxFilter{States: o.States, Metadata: o.Metadata, Limit: o.Limit, After: o.Cursor,
		Templates: o.Templates, CreatedFrom: o.CreatedFrom, Newest: o.Newest}
	if !c.Admin {
		f.Team = c.Team
	}
	return s.store.ListSandboxes(ctx, f)
}

// SetTimeout moves the sandbox's expiry to now + timeout.
func (s *Service) SetTimeout(ctx context.Context, c Caller, id string, timeoutS int) (store.Sandbox, error) {
	if !s.timeoutOK(timeoutS, true) {
		return store.Sandbox{}, errdefs.InvalidArgument("timeout_s: must be between 1 and %d", int(s.cfg.MaxTimeout.Seconds()))
	}
	sb, err := s.get(ctx, c, id)
	if err != nil {
		return sb, err
	}
	if sb.State != StateRunning && sb.State != StatePaused {
		return sb, stateConflict(sb.State, "sandbox %s is %s", id, sb.State)
	}
	// Only while it is still running or paused: the reaper may have taken
	// it for its old timeout since it was read (then this is a conflict,
	// not a 200 for a timeout that will never apply).
	if err := s.store.SetSandboxTimeout(ctx, id, []string{StateRunning, StatePaused}, timeoutS, s.now().UTC().Add(time.Duration(timeoutS)*time.Second)); err != nil {
		return sb, err
	}
	return s.store.GetSandbox(ctx, id)
}

// Kill destroys a sandbox. Killing a stopped sandbox is a no-op.
func (s *Service) Kill(ctx context.Context, c Caller, id string) error {
	sb, err := s.get(ctx, c, id)
	if err != nil {
		return err
	}
	if sb.State == StateStopped {
		return nil
	}
	s.mu.Lock()
	l := s.live[id]
	s.mu.Unlock()
	return s.destroy(ctx, id, l, "killed")
}

// destroy moves a sandbox through stopping to stopped and frees its host
// resources. l may be nil (not attached); the driver then recovers the
// instance from the persisted handle to destroy it.
func (s *Service) destroy(ctx context.Context, id string, l *live, reason string) error {
	ctx = context.WithoutCancel(ctx)
	if l != nil {
		l.lockOp()
		defer l.opMu.Unlock()
	}
	err := s.store.UpdateSandboxState(ctx, id, []string{StateCreating, StateRunning, StatePaused, StateError, StateStopping}, StateStopping, reason)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil // already stopped by someone else
		}
		return err
	}
	s.mu.Lock()
	if cur := s.live[id]; cur == l || l == nil {
		// Not attached when the kill began, attached since (a background
		// re-attach after a restart): that instance is the one to end.
		l = cur
		delete(s.live, id)
	}
	s.mu.Unlock()
	var inst driver.Instance
	if l != nil {
		l.agent.Close()
		inst = l.inst
	} else if sb, err := s.store.GetSandbox(ctx, id); err == nil && len(sb.Handle) > 0 {
		var h driver.Handle
		if json.Unmarshal(sb.Handle, &h) == nil {
			if d := s.drivers[h.Driver]; d != nil {
				var rerr error
				if inst, rerr = d.Recover(ctx, h); rerr != nil && !errors.Is(rerr, errdefs.ErrNotFound) {
					// The driver cannot tell whether it runs: what the
					// handle names is destroyed without asking it.
					// Marked stopped, a live instance would be left
					// behind; left unsure, it could never be killed.
					if err := destroyHandle(ctx, d, h); err != nil {
						s.log.Error("destroy", "sandbox", id, "err", err, "recover", rerr)
						_ = s.store.UpdateSandboxState(ctx, id, []string{StateStopping}, StateError, "destroy failed: "+err.Error())
						return errdefs.Unavailable("sandbox %s could not be destroyed; it is marked error and can be killed again", id)
					}
				}
			}
		}
	}
	if inst != nil {
		if err := inst.Destroy(ctx); err != nil {
			s.log.Error("destroy", "sandbox", id, "err", err)
			_ = s.store.UpdateSandboxState(ctx, id, []string{StateStopping}, StateError, "destroy failed: "+err.Error())
			return errdefs.Unavailable("sandbox %s could not be destroyed; it is marked error and can be killed again", id)
		}
	}
	s.dropNetwork(id)
	if err := s.store.UpdateSandboxState(ctx, id, []string{StateStopping}, StateStopped, reason); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil // a concurrent destroy finished first
		}
		return err
	}
	s.log.Info("sandbox stopped", "sandbox", id, "reason", reason)
	return nil
}

// Reap destroys sandboxes past their expiry and forgets records of
// sandboxes stopped long ago. It runs every interval until ctx ends.
func (s *Service) Reap(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.ReapOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReapOnce runs one pass of Reap.
func (s *Service) ReapOnce(ctx context.Context) {
	expired, err := s.store.ListExpired(ctx, s.now().UTC())
	if err != nil {
		s.log.Error("reaper: list expired", "err", err)
		return
	}
	for _, sb := range expired {
		s.mu.Lock()
		l := s.live[sb.ID]
		s.mu.Unlock()
		if sb.OnTimeout == "pause" && sb.State == StateRunning {
			// A long session: park it instead of losing it. The expiry is
			// cleared; Resume starts a new timeout period. A timeout set
			// since the list (the pass may be long) wins.
			if cur, err := s.store.GetSandbox(ctx, sb.ID); err != nil || !expiredAt(cur, s.now()) {
				continue
			}
			s.log.Info("sandbox timed out; pausing", "sandbox", sb.ID)
			if _, err := s.pause(ctx, Caller{Admin: true}, sb.ID, true); err != nil {
				s.log.Error("reaper: pause", "sandbox", sb.ID, "err", err)
			}
			continue
		}
		if sb.OnTimeout == "pause" && sb.State == StatePaused {
			_ = s.store.ClearExpiryIfPaused(ctx, sb.ID)
			continue
		}
		// Taken for its timeout only if its expiry is still past: a
		// timeout set since the list (a client extending it as it
		// expired, while this pass destroyed others) wins.
		if err := s.store.ExpireSandbox(ctx, sb.ID, []string{StateCreating, StateRunning, StatePaused, StateError}, s.now().UTC(), StateStopping, "timeout"); err != nil {
			if !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrNotFound) {
				s.log.Error("reaper: expire", "sandbox", sb.ID, "err", err)
			}
			continue
		}
		s.log.Info("sandbox timed out", "sandbox", sb.ID)
		if err := s.destroy(ctx, sb.ID, l, "timeout"); err != nil {
			s.log.Error("reaper: destroy", "sandbox", sb.ID, "err", err)
		}
	}
	if ids, err := s.store.DeleteStoppedBefore(ctx, s.now().UTC().Add(-s.cfg.StoppedRetention)); err != nil {
		s.log.Error("reaper: forget stopped", "err", err)
	} else if len(ids) > 0 {
		if s.egress != nil {
			// Their egress audit was readable while their records were.
			for _, id := range ids {
				s.egress.Proxy.ForgetRecords(id)
			}
		}
		s.log.Info("forgot stopped sandboxes", "count", len(ids))
	}
}

// Recover re-attaches every sandbox a previous server process left with host
// resources. Running and paused sandboxes whose instance still exists are
// re-attached; the rest are destroyed and marked stopped with a reason.
// Snapshots the previous process left half-made are marked failed first, so
// no client of this process ever sees one "creating" that nothing creates.
func (s *Service) Recover(ctx context.Context) error {
	if s.snaps != nil {
		s.CleanupSnapshots(ctx)
	}
	var sbs []store.Sandbox
	for cursor := ""; ; {
		page, next, err := s.store.ListSandboxes(ctx, store.SandboxFilter{States: liveStates, Limit: store.MaxListLimit, After: cursor})
		if err != nil {
			return err
		}
		sbs = append(sbs, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	for _, sb := range sbs {
		if err := ctx.Err(); err != nil {
			// Stopped during recovery: the rest stay as they are, for the
			// next start to re-attach.
			return err
		}
		log := s.log.With("sandbox", sb.ID)
		var h driver.Handle
		if sb.State == StatePooled && len(sb.Handle) == 0 {
			_ = s.store.DeleteSandbox(ctx, sb.ID)
			continue
		}
		if len(sb.Handle) == 0 || json.Unmarshal(sb.Handle, &h) != nil {
			s.markStopped(ctx, sb, "lost: no driver handle after restart")
			continue
		}
		d := s.drivers[h.Driver]
		if d == nil {
			s.markStopped(ctx, sb, "lost: driver "+h.Driver+" not enabled after restart")
			continue
		}
		inst, err := d.Recover(ctx, h)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
			// Not an answer about the instance (a bad handle): what the
			// handle names is destroyed.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn("recover failed; destroying what the handle names", "err", err)
			if derr := destroyHandle(ctx, d, h); derr != nil {
				// It may still run: kept, with its handle, for a kill.
				log.Error("destroy after a failed recover", "err", derr)
				_ = s.store.UpdateSandboxState(ctx, sb.ID, liveStates, StateError, "not re-attached after restart: "+err.Error()+"; destroy failed: "+derr.Error())
				continue
			}
			if sb.State == StatePooled {
				_ = s.store.DeleteSandbox(ctx, sb.ID)
			} else {
				s.markStopped(ctx, sb, "lost: "+err.Error())
			}
			continue
		}
		if errors.Is(err, errdefs.ErrUnavailable) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The driver could not tell whether the instance lives (a
			// runsc or a monitor slow to answer on a busy host): it is
			// left as it is and tried again in the background; until
			// then requests get 503 "not attached yet". Marked stopped, a
			// live sandbox went unreachable for good.
			log.Warn("sandbox not re-attached yet; trying again in the background", "err", err)
			s.retryRecover(sb, d, h)
			continue
		}
		if err != nil && sb.State == StatePooled {
			_ = s.store.DeleteSandbox(ctx, sb.ID)
			continue
		}
		if err != nil {
			log.Warn("recover failed; marking stopped", "err", err)
			s.markStopped(ctx, sb, "lost: instance gone after restart")
			continue
		}
		s.attachRecovered(ctx, sb, inst, log)
	}
	return nil
}

// attachRecovered takes over a sandbox a previous server process left,
// whose instance d.Recover found.
func (s *Service) attachRecovered(ctx context.Context, sb store.Sandbox, inst driver.Instance, log *slog.Logger) {
	if sb.State == StatePooled {
		// Warm sandboxes of the previous process: nobody owns them.
		_ = inst.Destroy(ctx)
		_ = s.store.DeleteSandbox(ctx, sb.ID)
		return
	}
	if sb.State != StateRunning && sb.State != StatePaused {
		// Interrupted mid-create or mid-destroy: finish the job.
		_ = inst.Destroy(ctx)
		s.markStopped(ctx, sb, "interrupted by server restart while "+sb.State)
		return
	}
	l := &live{inst: inst, agent: agentclient.New(inst.DialAgent, log)}
	if s.egress != nil {
		if n, err := s.store.GetNetwork(ctx, sb.ID); err == nil {
			// The agent's endpoint and its processes' env survived;
			// the proxy's state is rebuilt from the record.
			if _, err := s.bindNetwork(ctx, sb, n, l.agent, false); err != nil {
				log.Error("re-bind network after restart", "err", err)
			}
		}
	}
	if sb.State == StateRunning && sb.Team != poolTeam {
		l.ready = make(chan struct{})
		l.opMu.Lock()
		go s.confirmIdentity(sb, l)
	}
	s.mu.Lock()
	s.live[sb.ID] = l
	s.mu.Unlock()
	s.watch(sb.ID, l, nil)
	log.Info("sandbox re-attached", "state", sb.State)
}

// retryRecover tries to re-attach sb in the background until its driver
// answers: re-attached when the instance is found, marked stopped when it
// is gone, left for the next start if the server stops first.
func (s *Service) retryRecover(sb store.Sandbox, d driver.Driver, h driver.Handle) {
	s.background(func() {
		log := s.log.With("sandbox", sb.ID)
		giveUp := time.Now().Add(retryRecoverFor)
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			select {
			case <-s.bg.Done():
				return
			case <-time.After(wait):
			}
			inst, err := d.Recover(s.bg, h)
			switch {
			case err == nil:
				// The record may have moved on meanwhile (a kill).
				cur, gerr := s.store.GetSandbox(s.bg, sb.ID)
				if errors.Is(gerr, errdefs.ErrNotFound) {
					_ = inst.Destroy(context.WithoutCancel(s.bg)) // no record names it any more
					return
				}
				if gerr != nil {
					detach(inst)
					if s.bg.Err() != nil || time.Now().After(giveUp) {
						return
					}
					log.Warn("sandbox not re-attached yet: its record could not be read", "err", gerr)
					continue
				}
				if cur.State != sb.State {
					if cur.State == StateStopping || cur.State == StateStopped {
						_ = inst.Destroy(context.WithoutCancel(s.bg))
					} else {
						detach(inst)
					}
					return
				}
				s.attachRecovered(s.bg, cur, inst, log)
				// A kill between the read and the attach destroyed it by
				// its handle: it is not kept attached.
				if now, err := s.store.GetSandbox(s.bg, sb.ID); err == nil && (now.State == StateStopping || now.State == StateStopped) {
					s.mu.Lock()
					if l := s.live[sb.ID]; l != nil && l.inst == inst {
						delete(s.live, sb.ID)
						l.agent.Close()
					}
					s.mu.Unlock()
					s.dropNetwork(sb.ID) // the attach bound it again
					detach(inst)
				}
				return
			case errors.Is(err, errdefs.ErrNotFound):
				if sb.State == StatePooled {
					_ = s.store.DeleteSandbox(s.bg, sb.ID)
				} else {
					log.Warn("recover failed; marking stopped", "err", err)
					s.markStopped(s.bg, sb, "lost: instance gone after restart")
				}
				return
			case s.bg.Err() != nil:
				return
			}
			if time.Now().After(giveUp) {
				// Left in state error, with its handle: a kill or its
				// timeout destroys what the handle names.
				log.Error("sandbox not re-attached after restart; giving up", "err", err, "tried_for", retryRecoverFor)
				if sb.State == StatePooled {
					_ = destroyHandle(s.bg, d, h)
					_ = s.store.DeleteSandbox(s.bg, sb.ID)
				} else {
					_ = s.store.UpdateSandboxState(s.bg, sb.ID, []string{sb.State}, StateError, "not re-attached after restart: "+err.Error())
				}
				return
			}
			log.Warn("sandbox still not re-attached", "err", err, "retry_in", min(2*wait, time.Minute))
		}
	})
}

// background runs fn in a goroutine Shutdown waits for (s.bg ends it),
// unless Shutdown has begun.
func (s *Service) background(fn func()) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing.Load() {
		return
	}
	s.bgWG.Add(1)
	go func() {
		defer s.bgWG.Done()
		fn()
	}()
}

// retryRecoverFor is how long a sandbox whose driver cannot tell whether
// it runs is tried again after a restart.
const retryRecoverFor = time.Hour

// detach releases an instance's host-side handles without stopping it.
func detach(inst driver.Instance) {
	if dt, ok := inst.(driver.Detacher); ok {
		dt.Detach()
	}
}

// destroyHandle destroys what h names without asking the instance, where
// d can (driver.HandleDestroyer).
func destroyHandle(ctx context.Context, d driver.Driver, h driver.Handle) error {
	hd, ok := d.(driver.HandleDestroyer)
	if !ok {
		return errdefs.Unavailable("driver %s cannot destroy %s without its answer", h.Driver, h.ID)
	}
	return hd.DestroyHandle(ctx, h)
}

func (s *Service) markStopped(ctx context.Context, sb store.Sandbox, reason string) {
	_ = s.store.UpdateSandboxState(ctx, sb.ID, liveStates, StateStopped, reason)
}

// Shutdown drains the warm pools and detaches from every sandbox without
// stopping it: sandboxes keep running and the next server process
// re-attaches them.
func (s *Service) Shutdown() {
	s.bgMu.Lock()
	s.closing.Store(true) // no background work starts after this
	s.bgMu.Unlock()
	s.bgStop()
	s.StopPools()
	s.bgWG.Wait()
	s.procs.close()
	// Identities still on their way (warm claims answered a moment ago)
	// get a few seconds to arrive; one that does not is delivered by the
	// next server process (confirmIdentity), never a reason to destroy.
	s.mu.Lock()
	pending := make([]*live, 0)
	for _, l := range s.live {
		if l.ready != nil {
			pending = append(pending, l)
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	for _, l := range pending {
		_ = l.wait(ctx)
	}
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, l := range s.live {
		if dt, ok := l.inst.(driver.Detacher); ok {
			dt.Detach()
		}
		l.agent.Close()
		delete(s.live, id)
	}
}

// Counts returns the number of sandboxes per state (for metrics).
func (s *Service) Counts(ctx context.Context) (map[string]int, error) {
	return s.store.CountSandboxesByState(ctx)
}

// expiredAt reports whether sb's expiry is set and past at now.
func expiredAt(sb store.Sandbox, now time.Time) bool {
	return !sb.ExpiresAt.IsZero() && !sb.ExpiresAt.After(now)
}
