package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// MaxForks caps one fork call.
const MaxForks = 16

// Fork makes count new running sandboxes from the live state of sandbox id
// (checkpoint, then count restores) or, when sid is set, from that
// checkpoint snapshot. The parent keeps running. Each child has its own id,
// writable layer and agent session, and is re-seeded with fresh entropy.
// If any child fails, every child made by the call is destroyed.
func (s *Service) Fork(ctx context.Context, c Caller, id string, count int, sid string) ([]store.Sandbox, error) {
	if count == 0 {
		count = 1
	}
	if count < 0 || count > MaxForks {
		return nil, errdefs.InvalidArgument("count: must be between 1 and %d", MaxForks)
	}
	ctx = context.WithoutCancel(ctx)
	var (
		parent store.Sandbox
		image  string
		err    error
	)
	if sid == "" {
		var l *live
		parent, l, err = s.liveOf(ctx, c, id, StateRunning)
		if err != nil {
			return nil, err
		}
		// All children must fit before the checkpoint is taken (each
		// child's record is checked again when it is written).
		if _, err := s.admit(ctx, childTeam(c, parent), count, store.SizeOf(parent)); err != nil {
			return nil, err
		}
		cp, ok := l.inst.(driver.Checkpointer)
		if _, canRestore := s.drivers[parent.Driver].(driver.Restorer); !ok || !canRestore {
			return nil, errdefs.NotSupported("driver %s cannot fork", parent.Driver)
		}
		image, err = os.MkdirTemp(s.tmpDir(), "fork-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(image)
		l.lockOp()
		err = cp.Checkpoint(ctx, image, true)
		l.opMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("checkpoint for fork: %v: %w", err, errdefs.ErrUnavailable)
		}
	} else {
		parent, err = s.get(ctx, c, id)
		if err != nil {
			return nil, err
		}
		var sn store.Snapshot
		if image, sn, err = s.materialize(ctx, c, sid); err != nil {
			return nil, err
		}
		defer os.RemoveAll(image)
		if sn.SandboxID != parent.ID {
			return nil, errdefs.InvalidArgument("snapshot %s is not of sandbox %s", sid, id)
		}
		if _, err := s.admit(ctx, childTeam(c, parent), count, store.SizeOf(parent)); err != nil {
			return nil, err
		}
	}
	children := make([]store.Sandbox, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4) // restores are CPU-heavy: a few at a time
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			children[i], errs[i] = s.restoreSandbox(ctx, c, parent, image, CreateRequest{})
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			for _, ch := range children {
				if ch.ID != "" {
					s.mu.Lock()
					l := s.live[ch.ID]
					s.mu.Unlock()
					_ = s.destroy(ctx, ch.ID, l, "fork rolled back")
				}
			}
			return nil, e
		}
	}
	s.log.Info("sandbox forked", "sandbox", id, "count", count, "snapshot", sid)
	return children, nil
}

// materialize writes a checkpoint snapshot's image into a temp dir.
func (s *Service) materialize(ctx context.Context, c Caller, sid string) (string, store.Snapshot, error) {
	if s.snaps == nil {
		return "", store.Snapshot{}, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	defer s.pinSnapshot(sid)()
	sn, err := s.readySnapshot(ctx, c, sid)
	if err != nil {
		return "", sn, err
	}
	if sn.Kind != KindCheckpoint {
		return "", sn, errdefs.InvalidArgument("snapshot %s is a %s snapshot; this needs a checkpoint", sid, sn.Kind)
	}
	m, err := s.snaps.Store.Open(sn.ID)
	if err != nil {
		return "", sn, err
	}
	dir, err := os.MkdirTemp(s.tmpDir(), "restore-")
	if err != nil {
		return "", sn, err
	}
	if err := os.Remove(dir); err != nil { // MaterializeDir creates it
		return "", sn, err
	}
	if err := s.snaps.Store.MaterializeDir(ctx, m, dir); err != nil {
		os.RemoveAll(dir)
		return "", sn, err
	}
	return dir, sn, nil
}

// restoreSandbox starts a new sandbox from a checkpoint image of parent,
// with parent's configuration unless req overrides it.
func (s *Service) restoreSandbox(ctx context.Context, c Caller, parent store.Sandbox, image string, req CreateRequest) (store.Sandbox, error) {
	// A restore must finish or roll back even if its client goes away (a
	// cancelled context failed the rollback's destroy and record update,
	// leaving a running instance behind a "creating" record).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	start := s.now()
	d := s.drivers[parent.Driver]
	r, ok := d.(driver.Restorer)
	if d == nil || !ok {
		return store.Sandbox{}, errdefs.NotSupported("driver %s cannot restore", parent.Driver)
	}
	now := s.now().UTC()
	sb := parent
	sb.ID, sb.Team, sb.State, sb.Reason, sb.Handle = newID(), childTeam(c, parent), StateCreating, "", nil
	sb.CreatedAt, sb.UpdatedAt, sb.StoppedAt = now, now, nil
	sb.Env = maps.Clone(parent.Env)
	if sb.Env == nil {
		sb.Env = map[string]string{}
	}
	sb.Metadata = maps.Clone(parent.Metadata)
	if req.TimeoutS > 0 {
		sb.TimeoutS = req.TimeoutS
	}
	if req.OnTimeout != "" {
		sb.OnTimeout = req.OnTimeout
	}
	if req.PublicPorts {
		sb.PublicPorts = true
	}
	if req.AutoResume {
		sb.AutoResume = true
	}
	if req.SnapshotOnExec != nil {
		sb.SnapshotOnExec = *req.SnapshotOnExec
	}
	if req.Metadata != nil {
		sb.Metadata = req.Metadata
	}
	for k, v := range req.Env {
		sb.Env[k] = v
	}
	sb.ExpiresAt = now.Add(time.Duration(sb.TimeoutS) * time.Second)
	quota, err := s.admit(ctx, sb.Team, 1, store.SizeOf(sb))
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := s.store.CreateSandboxWithin(ctx, sb, quota); err != nil {
		return store.Sandbox{}, err
	}
	log := s.log.With("sandbox", sb.ID)
	var inst driver.Instance
	var agent *agentclient.Client
	fail := func(err error) (store.Sandbox, error) {
		if agent != nil {
			agent.Close()
		}
		if inst != nil {
			err = leftBehind(err, inst.Destroy(ctx))
		}
		s.dropNetwork(sb.ID)
		s.dropFailed(ctx, sb.ID, []string{StateCreating}, err)
		return store.Sandbox{}, err
	}
	tpl, err := s.store.GetTemplate(ctx, parent.Template)
	if err != nil || tpl.Digest != parent.TemplateDigest {
		return fail(errdefs.Unavailable("template %s of the checkpoint is no longer available", parent.Template))
	}
	rootfs, kind, err := s.rootfs(ctx, parent.Driver, tpl)
	if err != nil {
		return fail(err)
	}
	spec := driver.Spec{
		ID: sb.ID, Hostname: "sandbox", Rootfs: rootfs, RootfsKind: kind,
		StateDir: s.stateDir(sb.ID), AgentPath: s.cfg.AgentPath, VCPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
	}
	// Recorded first: a server that dies during the restore finds (and
	// removes) what it made.
	ph, _ := json.Marshal(driver.StateDirHandle(parent.Driver, spec))
	if err := s.store.SetSandboxHandle(ctx, sb.ID, ph); err != nil {
		return fail(err)
	}
	inst, err = r.Restore(ctx, spec, image)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			// The image cannot be restored here at all (made by another
			// runtime build): retrying will not help.
			return fail(fmt.Errorf("restore: %w", err))
		}
		return fail(fmt.Errorf("restore: %v: %w", err, errdefs.ErrUnavailable))
	}
	h, _ := json.Marshal(inst.Handle())
	if err := s.store.SetSandboxHandle(ctx, sb.ID, h); err != nil {
		return fail(err)
	}
	agent = agentclient.New(inst.DialAgent, log)
	if n, err := s.store.GetNetwork(ctx, parent.ID); err == nil {
		// The same policy and secrets, with placeholders of its own.
		n.SandboxID = sb.ID
		if err := s.store.PutNetwork(ctx, n); err != nil {
			return fail(err)
		}
	}
	seed := make([]byte, 32)
	rand.Read(seed)
	// A fresh identity: the new id and env, new entropy, the host's clock.
	if err := s.initAgent(ctx, sb, agent, agentproto.InitRequest{Seed: seed, Entropy: freshEntropy(), Time: s.now().UTC()}, true); err != nil {
		return fail(fmt.Errorf("restored agent did not answer: %v: %w", err, errdefs.ErrUnavailable))
	}
	l := &live{inst: inst, agent: agent}
	s.mu.Lock()
	s.live[sb.ID] = l
	s.mu.Unlock()
	if err := s.store.UpdateSandboxState(ctx, sb.ID, []string{StateCreating}, StateRunning, ""); err != nil {
		s.mu.Lock()
		delete(s.live, sb.ID)
		s.mu.Unlock()
		return fail(err)
	}
	s.watch(sb.ID, l, nil)
	log.Info("sandbox restored", "from", parent.ID, "ms", s.now().Sub(start).Milliseconds())
	return s.store.GetSandbox(ctx, sb.ID)
}

// childTeam is the team a fork's or restore's new sandbox belongs to: the
// caller's, or for an admin the parent's.
func childTeam(c Caller, parent store.Sandbox) string {
	if c.Admin {
		return parent.Team
	}
	return c.Team
}
