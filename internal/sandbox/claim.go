package sandbox

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Claiming a warm sandbox for a create: the claim itself (store record,
// quota, rollback to the pool) and the delivery of the caller's identity
// (env, network, secrets) to the claimed sandbox's agent, confirmed before
// the create answers.

// claim turns a warm sandbox into the caller's.
//
// One compare-and-set gives the record its owner and makes it running (a
// network policy's record, with placeholders for its secrets, is stored
// just before), and the create is answered at once. The identity (id,
// env, fresh entropy: a forced reseed of the guest's RNG, whose state a
// restored sandbox shares with every clone of its pool's image) is
// delivered in the background, after the sandbox got its normal CPU share
// back (both take a wake-up of the sandbox, which on a small host costs
// more than the rest of a create); with a network policy, the policy and
// placeholders are bound to the proxy and the agent gets the endpoint, CA
// and proxy env with it. Nothing reaches the guest before it: every
// request for the sandbox goes through liveOf, which waits for it, and
// lifecycle operations wait on opMu, held meanwhile. A pooled sandbox has
// no network until then. If the delivery fails the sandbox is destroyed
// and requests get the error; if the server dies meanwhile, Recover finds
// the agent without this id and delivers it then, network and all
// (confirmIdentity).
//
// On failure before the answer the warm sandbox is destroyed, never put
// back; except when the team's quota refused the claim (the record is
// still pooled and the guest got nothing): then it goes back to p, or a
// team at its quota could empty every pool with a burst of creates.
func (s *Service) claim(ctx context.Context, c Caller, want store.Sandbox, req CreateRequest, p *pool, w *warm, quota store.Quota) (store.Sandbox, error) {
	sb := w.sb
	sb.Team, sb.Env, sb.Metadata = want.Team, want.Env, want.Metadata
	sb.TimeoutS, sb.OnTimeout = want.TimeoutS, want.OnTimeout
	sb.CreatedAt, sb.UpdatedAt, sb.ExpiresAt = want.CreatedAt, want.CreatedAt, want.ExpiresAt
	sb.SnapshotIntervalS, sb.RetentionDays = want.SnapshotIntervalS, want.RetentionDays
	sb.PublicPorts, sb.AutoResume = want.PublicPorts, want.AutoResume
	sb.SnapshotOnExec = want.SnapshotOnExec
	sb.State = StateRunning
	fail := func(err error) (store.Sandbox, error) {
		s.dropNetwork(sb.ID)
		s.discardWarm(w)
		return store.Sandbox{}, err
	}
	l := &live{inst: w.inst, agent: w.agent}
	network := (req.Network != nil && !req.Network.empty()) || len(req.Secrets) > 0
	if network {
		// The policy's record first, so that a server that dies before
		// the delivery re-binds it at restart (confirmIdentity).
		if err := s.putNetwork(ctx, sb.ID, req.Network, req.Secrets); err != nil {
			return fail(err)
		}
	}
	if err := s.store.ClaimSandboxWithin(ctx, sb, quota); err != nil {
		if !errorsIs(err, errdefs.ErrQuotaExceeded) {
			return fail(err)
		}
		if network {
			if derr := s.store.DeleteNetwork(context.WithoutCancel(ctx), sb.ID); derr != nil {
				return fail(err) // its policy record must not follow it back
			}
		}
		p.giveBack(w)
		return store.Sandbox{}, err
	}
	init := claimInit(w, req)
	init.SandboxID, init.Env = sb.ID, maps.Clone(sb.Env)
	l.ready, l.urgent = make(chan struct{}), make(chan struct{})
	l.opMu.Lock()
	s.mu.Lock()
	s.live[sb.ID] = l // before the delivery, which may destroy it
	s.mu.Unlock()
	go s.deliverIdentity(sb, l, init, network)
	s.watch(sb.ID, l, w.stopMemWatch)
	s.log.Info("sandbox created from the warm pool", "sandbox", sb.ID, "template", sb.Template, "driver", sb.Driver, "restored", w.restored)
	return sb, nil
}

// deliverIdentity sends init to a claimed sandbox's agent, then lets
// requests through (l.ready) and lifecycle operations (l.opMu, which the
// caller locked). A sandbox whose agent does not take it is destroyed.
//
// It starts once the create burst it belongs to is over (waking a sandbox
// costs it tens of ms of CPU; twenty at once kept the server from
// answering the rest of the burst) or at once when something needs the
// sandbox (hurry): a create followed by an exec waits no longer.
func (s *Service) deliverIdentity(sb store.Sandbox, l *live, init agentproto.InitRequest, network bool) {
	s.afterBurst(l.urgent, identityMaxDefer, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := prioritize(ctx, l.inst)
	switch {
	case err != nil:
	case network:
		// The policy and the placeholders the claim minted a moment ago
		// (putNetwork) go to the proxy, and the agent gets the endpoint,
		// the CA and the proxy env with the rest.
		err = s.initAgent(ctx, sb, l.agent, init, false)
	default:
		err = l.agent.Init(ctx, init)
	}
	cancel()
	s.identityDone(sb.ID, l, err)
}

// identityDone ends an identity delivery: requests go through (l.ready)
// and lifecycle operations too (l.opMu, held by the delivery). A sandbox
// whose agent did not take its identity must not run without it: requests
// get the error, and it is destroyed, unless the server is stopping (it
// closed the agent channel; the next server process delivers it).
func (s *Service) identityDone(id string, l *live, err error) {
	if err != nil {
		l.initErr = fmt.Errorf("sandbox %s did not start: its agent refused its identity: %v: %w", id, err, errdefs.ErrUnavailable)
	}
	close(l.ready)
	l.opMu.Unlock()
	if err != nil && s.closing.Load() {
		s.log.Warn("claimed sandbox's identity not delivered before shutdown", "sandbox", id, "err", err)
		return
	}
	if err != nil {
		s.log.Error("claimed sandbox did not take its identity; destroying it", "sandbox", id, "err", err)
		_ = s.destroy(context.Background(), id, l, "error: identity not delivered")
	}
}

// prioritize gives a claimed sandbox the normal CPU share (pooled ones
// wait at the lowest).
func prioritize(ctx context.Context, inst driver.Instance) error {
	if pr, ok := inst.(driver.Prioritizer); ok {
		return pr.Prioritize(ctx)
	}
	return nil
}

// confirmIdentity runs for a running sandbox re-attached at start: a
// claim whose identity delivery the previous server process did not finish
// left an agent that never got this sandbox's id; it gets it now. Agents
// older than protocol 2 do not report the id and are left alone.
//
// Whether the agent has its identity is asked until it answers (a busy
// restart re-attaches many sandboxes at once), for confirmWithin at most;
// one that never answers is not trusted to have it: requests get an error
// (the sandbox stays for its owner to delete, and the next server start
// asks again). An agent that refuses the identity is destroyed, as at a
// claim.
func (s *Service) confirmIdentity(sb store.Sandbox, l *live) {
	ctx, cancel := context.WithTimeout(context.Background(), confirmWithin)
	defer cancel()
	var info agentproto.Info
	var err error
	delay := 100 * time.Millisecond
ask:
	for {
		actx, acancel := context.WithTimeout(ctx, 20*time.Second)
		info, err = l.agent.Info(actx)
		acancel()
		if err == nil || s.closing.Load() {
			break
		}
		select {
		case <-ctx.Done():
			break ask
		case <-time.After(delay):
			delay = min(2*delay, 5*time.Second)
		}
	}
	if err != nil {
		l.initErr = fmt.Errorf("sandbox %s: its agent did not answer since the server restarted, so its identity is not confirmed: %v: %w", sb.ID, err, errdefs.ErrUnavailable)
		s.log.Error("re-attached sandbox's agent did not answer; its requests are refused", "sandbox", sb.ID, "err", err)
		close(l.ready)
		l.opMu.Unlock()
		return
	}
	if v, _ := strconv.Atoi(info.Version); v < 2 || info.SandboxID == sb.ID {
		close(l.ready)
		l.opMu.Unlock()
		return
	}
	// With the sandbox's network, when it has one: the claim stored its
	// record, and Recover bound the proxy to it; the agent has neither
	// the endpoint nor the env yet, and placeholders are minted afresh.
	err = s.initAgent(ctx, sb, l.agent, agentproto.InitRequest{Entropy: freshEntropy()}, true)
	if err == nil {
		s.log.Warn("re-attached sandbox got the identity its claim had not delivered", "sandbox", sb.ID)
	}
	s.identityDone(sb.ID, l, err)
}

// claimInit is what a claim's Init carries beyond the identity: fresh
// entropy always (gVisor's RNG is the host's, and the ioctl is skipped
// there), the host's clock for a restored sandbox.
func claimInit(w *warm, creq CreateRequest) agentproto.InitRequest {
	req := agentproto.InitRequest{Entropy: freshEntropy(), KeepPrestarted: creq.KeepPrestarted}
	if w.restored {
		req.Time = time.Now().UTC()
	}
	return req
}
