package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/hostproc"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Instance is one microVM (one sandbox).
type Instance struct {
	d        *Driver
	id       string
	stateDir string
	root     string // the VM's root directory (the chroot under the jailer)
	log      *slog.Logger
	machine  machine
	low      bool // pooled: the lowest CPU share until Prioritize

	// gate keeps agent connections out of a snapshot: Firecracker's vsock
	// must be idle while one is taken. A connection attempt holds it
	// shared; Checkpoint holds it exclusively.
	gate   sync.RWMutex
	dialMu sync.Mutex // one DialAgent at a time
	opMu   sync.Mutex // one state change (pause, resume, checkpoint) at a time

	mu        sync.Mutex
	current   net.Conn // the agent connection last handed out
	started   bool
	pid       int
	destroyed bool
}

func (i *Instance) consolePath() string { return filepath.Join(i.stateDir, "console.log") }
func (i *Instance) machinePath() string { return filepath.Join(i.stateDir, "vm.json") }
func (i *Instance) apiSock() string     { return filepath.Join(i.root, apiSockName) }
func (i *Instance) vsockPath() string   { return filepath.Join(i.root, vsockName) }

// pidPath is where the jailer writes Firecracker's pid (--new-pid-ns).
func (i *Instance) pidPath() string { return filepath.Join(i.root, i.d.execName+".pid") }

func (i *Instance) api() *apiClient { return newAPIClient(i.apiSock()) }

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// Handle implements driver.Instance.
func (i *Instance) Handle() driver.Handle {
	i.mu.Lock()
	pid := i.pid
	i.mu.Unlock()
	data, _ := json.Marshal(handleData{StateDir: i.stateDir, Root: i.root, Pid: pid})
	return driver.Handle{Driver: Name, ID: i.id, Data: data}
}

// Start implements driver.Instance: it launches Firecracker, configures
// the VM and boots it; the agent answers DialAgent once the guest is up. A
// failed start kills the process and removes the VM's root directory (the
// jail with the disk); Destroy removes the rest.
func (i *Instance) Start(ctx context.Context) (err error) {
	i.mu.Lock()
	if i.started {
		i.mu.Unlock()
		return errdefs.Conflict("sandbox already started")
	}
	i.started = true
	i.mu.Unlock()
	defer func() {
		if err != nil {
			i.abort()
		}
	}()
	if err := i.launch(ctx); err != nil {
		return err
	}
	if err := i.api().run(ctx, bootSequence(i.machine)); err != nil {
		return fmt.Errorf("firecracker: boot %s: %w (console: %s)", i.id, err, hostproc.TailFile(i.consolePath(), 1500))
	}
	return nil
}

// abort undoes a failed launch: the process is killed and the jail (or
// the direct-mode root) removed.
func (i *Instance) abort() {
	i.mu.Lock()
	pid := i.pid
	i.mu.Unlock()
	if pid <= 0 {
		pid = hostproc.ReadPid(i.pidPath())
	}
	if err := i.killPid(pid); err != nil {
		i.log.Warn("abort start", "err", err)
	}
	if err := os.RemoveAll(i.d.jailDir(i.stateDir, i.id)); err != nil {
		i.log.Warn("abort start: remove jail", "err", err)
	}
}

// Pause implements driver.Instance (PATCH /vm Paused: the vCPUs stop).
// Firecracker keeps a paused VM paused on a repeated call.
func (i *Instance) Pause(ctx context.Context) error {
	i.opMu.Lock()
	defer i.opMu.Unlock()
	return i.setState(ctx, statePaused)
}

// Resume implements driver.Instance (PATCH /vm Resumed); resuming a
// running VM is a no-op for Firecracker.
func (i *Instance) Resume(ctx context.Context) error {
	i.opMu.Lock()
	defer i.opMu.Unlock()
	return i.setState(ctx, stateResumed)
}

func (i *Instance) setState(ctx context.Context, state string) error {
	i.mu.Lock()
	started := i.started
	i.mu.Unlock()
	if !started {
		return errdefs.Conflict("sandbox not started")
	}
	err := i.api().do(ctx, http.MethodPatch, "/vm", vmState{State: state}, nil)
	if err != nil && errors.Is(err, errdefs.ErrUnavailable) && i.exited() {
		return i.notRunning()
	}
	return err
}

// DialAgent implements driver.Instance. It closes the connection handed
// out before (the newest caller wins), connects to the vsock socket and
// asks for the agent's port, retrying until the agent answers or ctx ends.
func (i *Instance) DialAgent(ctx context.Context) (net.Conn, error) {
	i.dialMu.Lock()
	defer i.dialMu.Unlock()
	i.Detach()
	wait := 2 * time.Millisecond
	var lastErr error
	for {
		conn, err := i.dialOnce(ctx)
		if err == nil {
			i.mu.Lock()
			i.current = conn
			i.mu.Unlock()
			return conn, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		if i.exited() {
			return nil, i.notRunning()
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait = min(wait*2, 100*time.Millisecond)
	}
	return nil, fmt.Errorf("firecracker: waiting for agent of %s: %v: %w", i.id, lastErr, errdefs.ErrUnavailable)
}

// attemptTimeout bounds one connection attempt: a paused guest never
// answers, and a checkpoint waits for attempts in flight.
const attemptTimeout = 2 * time.Second

func (i *Instance) dialOnce(ctx context.Context) (net.Conn, error) {
	i.gate.RLock()
	defer i.gate.RUnlock()
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	c, err := dialUnix(ctx, i.vsockPath())
	if err != nil {
		return nil, err
	}
	conn, err := vsockConnect(ctx, c, AgentPort)
	if err != nil {
		c.Close()
		return nil, err
	}
	return conn, nil
}

// exited reports whether the VM was started and its process is gone.
func (i *Instance) exited() bool {
	i.mu.Lock()
	pid, started := i.pid, i.started
	i.mu.Unlock()
	return started && pid > 0 && !hostproc.Alive(pid)
}

// Wait implements driver.Instance, on a pidfd of the Firecracker process
// (not the server's child under the jailer), so it works for recovered
// instances too.
func (i *Instance) Wait(ctx context.Context) (driver.ExitStatus, error) {
	return hostproc.WaitInstance(ctx, func() (int, bool) {
		i.mu.Lock()
		defer i.mu.Unlock()
		return i.pid, i.destroyed
	})
}

// Detach implements driver.Detacher: it closes the agent connection; the
// VM runs on and a later Recover re-attaches.
func (i *Instance) Detach() {
	i.mu.Lock()
	c := i.current
	i.current = nil
	i.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Destroy implements driver.Instance: it kills Firecracker (if it is
// still this sandbox's process) and removes the state dir with the jail.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	i.destroyed = true
	pid := i.pid
	i.mu.Unlock()
	i.Detach()
	if pid <= 0 {
		pid = hostproc.ReadPid(i.pidPath()) // a launch that failed half-way
	}
	if err := i.killPid(pid); err != nil {
		return err
	}
	if err := cgroup.Remove(i.id); err != nil {
		return fmt.Errorf("firecracker: %w", err)
	}
	if i.stateDir != "" {
		if err := os.RemoveAll(i.stateDir); err != nil {
			return fmt.Errorf("firecracker: remove state dir: %w", err)
		}
	}
	return nil
}

// Prioritize implements driver.Prioritizer: a pooled VM's cgroup gets the
// normal CPU share.
func (i *Instance) Prioritize(ctx context.Context) error {
	if err := cgroup.Prioritize(i.id); err != nil {
		return fmt.Errorf("firecracker: %w", err)
	}
	return nil
}
