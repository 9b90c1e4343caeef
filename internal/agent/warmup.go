package agent

import (
	"net/http"

	"github.com/spacesandbox/space/internal/agentproto"
)

// warmups are what the first commands in a sandbox have in common: a
// program started as the sandbox's user (the user lookup, the dynamic
// loader, libc) and a login shell, as every shell command and E2B
// commands.run is (bash, its libraries, /etc/profile).
var warmups = []agentproto.StartRequest{
	{Cmd: []string{"true"}},
	{Shell: "true"},
}

// handleWarmup runs the warmups and forgets them. A sandbox started ahead
// of demand (a warm pool) runs it before it is handed out, so its first
// command does not pay for cold caches: in gVisor the sentry reads the
// loader, libc and bash into its page cache on first use, and the agent
// resolves and caches the user (~20 ms of a ~50 ms first exec here). It
// runs before any identity: nothing of a tenant is involved, and the
// processes are gone from the process list before it answers.
func (a *Agent) handleWarmup(w http.ResponseWriter, r *http.Request) {
	for _, req := range warmups {
		p, _, err := a.start(req, false)
		if err != nil {
			writeError(w, err)
			return
		}
		select {
		case <-p.done:
			a.forget(p)
		case <-r.Context().Done():
			go func() {
				<-p.done
				a.forget(p)
			}()
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// forget drops an exited process from the process list.
func (a *Agent) forget(p *process) {
	a.mu.Lock()
	if a.procs[p.pid] == p {
		delete(a.procs, p.pid)
	}
	a.mu.Unlock()
	a.balanceOutput()
}
