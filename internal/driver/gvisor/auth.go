package gvisor

// The agent's channel is authenticated per boot (agentproto/auth.go).
// Root inside the sandbox can reach the agent's socket: it can stop the
// real agent and connect in its place. So:
//
//   - A fresh boot gets a new secret: the host's copy is <state>/agent.secret
//     (0600), the agent's is <state>/run/agent.secret (0400, in the run
//     directory the sandbox sees at /.space/run, itself 0700 root), named
//     by --auth-file. The agent reads it at start and keeps it in memory;
//     the host removes the agent's file after the first connection that
//     authenticated, so no later process in the sandbox finds it.
//   - Every accepted connection must answer the host's challenge within
//     authWithin, at most maxHandshakes at once; the others are closed
//     before a byte of agent protocol is read from them.
//   - One session at a time: an authenticated connection never displaces
//     the one in use (listen), it waits until the client dials again,
//     which it does only once its session ended.
//   - Checkpoint images carry the secret (the agent restored from one has
//     it in memory), so restores, forks and warm pools authenticate too. A
//     fork's child shares its parent's secret; a pool image's sandboxes
//     share theirs. That gives nothing away: a secret is only any use on
//     the socket of a sandbox restored from the same image, reachable
//     only from inside that sandbox, whose agent already holds it.
//   - An image made before version 9 has no secret: its sandboxes are not
//     authenticated (their old agent cannot answer), the other rules hold.
//
// Root in the sandbox who reads the agent's memory can learn the secret;
// what keeps the host safe from any agent is that the host bounds every
// read of what an agent says (agentclient/limits.go).

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
)

const (
	secretFile = "agent.secret" // in the state dir, the run dir and images
	// authWithin bounds one connection's handshake.
	authWithin = 10 * time.Second
	// maxHandshakes bounds the connections authenticating at once.
	maxHandshakes = 4
)

func (i *Instance) secretPath() string      { return filepath.Join(i.stateDir, secretFile) }
func (i *Instance) guestSecretPath() string { return filepath.Join(i.runDir(), secretFile) }

// newSecret gives a fresh boot its secret: the host's copy and the
// agent's file.
func (i *Instance) newSecret() error {
	s := agentproto.NewSecret()
	if err := writeSecret(i.secretPath(), s, 0o600); err != nil {
		return err
	}
	if err := writeSecret(i.guestSecretPath(), s, 0o400); err != nil {
		return err
	}
	i.mu.Lock()
	i.secret = s
	i.mu.Unlock()
	return nil
}

// adoptSecret takes the secret of the checkpoint image in dir (the
// restored agent holds it). An image without one leaves the instance
// unauthenticated.
func (i *Instance) adoptSecret(dir string) error {
	s, err := agentproto.ReadSecret(filepath.Join(dir, secretFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint image: %w", err)
	}
	if err := writeSecret(i.secretPath(), s, 0o600); err != nil {
		return err
	}
	i.mu.Lock()
	i.secret = s
	i.mu.Unlock()
	return nil
}

// loadSecret reads the host's copy of a recovered instance's secret
// (none: a sandbox started before version 9).
func (i *Instance) loadSecret() error {
	s, err := agentproto.ReadSecret(i.secretPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gvisor: agent secret: %w", err)
	}
	i.mu.Lock()
	i.secret = s
	i.mu.Unlock()
	return nil
}

// imageSecret puts the instance's secret into the checkpoint image in dir.
func (i *Instance) imageSecret(dir string) error {
	i.mu.Lock()
	s := i.secret
	i.mu.Unlock()
	if s == nil {
		return nil
	}
	return writeSecret(filepath.Join(dir, secretFile), s, 0o600)
}

func writeSecret(path string, s []byte, mode os.FileMode) error {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("gvisor: agent secret: %w", err)
	}
	if _, err := f.Write(s); err != nil {
		f.Close()
		return fmt.Errorf("gvisor: agent secret: %w", err)
	}
	return f.Close()
}

// admit authenticates a connection accepted on the agent socket: true
// when it answered the challenge with the instance's secret (or the
// instance has none).
func (i *Instance) admit(c net.Conn) bool {
	i.mu.Lock()
	s := i.secret
	i.mu.Unlock()
	if s == nil {
		return true
	}
	c.SetDeadline(time.Now().Add(authWithin))
	err := agentproto.Authenticate(c, s)
	c.SetDeadline(time.Time{})
	if err != nil {
		// Once per instance at Warn: an impostor may try in a loop.
		if i.refused.Add(1) == 1 {
			i.log.Warn("agent connection refused: it did not authenticate", "err", err)
		} else {
			i.log.Debug("agent connection refused", "err", err, "refused", i.refused.Load())
		}
		return false
	}
	i.authOnce.Do(func() { _ = os.Remove(i.guestSecretPath()) })
	return true
}
