package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
)

// A warm pool may start a process before the sandbox has an owner (the
// E2B code interpreter's kernel, so that a claimed sandbox's first
// execution does not wait for Python and its libraries to load). Such a
// process was started with the pool's environment, not the owner's; the
// claim's Init settles it before anything else reaches the sandbox: kept,
// it reads the owner's environment as one line on its stdin (and applies
// it to itself); not kept, it is killed and forgotten, and the paths made
// for it (StartRequest.InitDiscard: the kernel's script) are removed.

// prestartWait bounds how long an Init waits for a prestarted process to
// take its line, or to exit once killed.
const prestartWait = 2 * time.Second

// settleIdentity gives the processes that follow the identity the env of
// an Init that gave one: those started with InitStdin since the last such
// Init are kept (they get the line) or killed, as keep says; those that
// follow every Init (FollowInit, or kept before: the kernels a fork's
// child or a sandbox made from a checkpoint holds) get the line.
func (a *Agent) settleIdentity(env map[string]string, keep bool) {
	a.mu.Lock()
	var pending, following []*process
	for _, p := range a.procs {
		switch {
		case p.initStdin:
			p.initStdin = false
			pending = append(pending, p)
		case p.followInit:
			following = append(following, p)
		}
	}
	a.mu.Unlock()
	if len(pending)+len(following) == 0 {
		return
	}
	var line agentproto.InitLine
	line.Init.Env = env
	if line.Init.Env == nil {
		line.Init.Env = map[string]string{}
	}
	b, _ := json.Marshal(line)
	b = append(b, '\n')
	give := func(p *process, b []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), prestartWait)
		defer cancel()
		return p.writeStdin(ctx, bytes.NewReader(b), false)
	}
	// A following process (a kernel) may hold the start of a request cut
	// short (its client left while it was written): a newline first ends
	// it, so the identity is a line of its own, not lost with it. (A
	// prestarted process's first line is the identity: none there.)
	nb := append([]byte{'\n'}, b...)
	for _, p := range following {
		if !p.snapshot().Running {
			continue
		}
		if err := give(p, nb); err != nil {
			// It would run on with the env (and placeholders) of the
			// sandbox it was copied from.
			a.log.Warn("process following the identity did not take it; killing it", "pid", p.pid, "err", err)
			_ = unix.Kill(-p.pid, unix.SIGKILL)
		}
	}
	for _, p := range pending {
		if keep && p.snapshot().Running {
			err := give(p, b)
			if err == nil {
				a.mu.Lock()
				p.followInit = true
				a.mu.Unlock()
				continue
			}
			// It cannot take the owner's environment: it must not run on
			// with the pool's.
			a.log.Warn("prestarted process did not take the identity; killing it", "pid", p.pid, "err", err)
		}
		_ = unix.Kill(-p.pid, unix.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(prestartWait):
			a.log.Warn("prestarted process did not exit after SIGKILL", "pid", p.pid)
		}
		a.forget(p)
		for _, path := range p.initDiscard {
			if err := os.RemoveAll(path); err != nil {
				a.log.Warn("prestarted process: remove what was made for it", "path", path, "err", err)
			}
		}
	}
}
