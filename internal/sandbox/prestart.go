package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
)

// Prestart is a process a warm pool starts in each of its sandboxes
// before the sandbox joins the pool, so that a claim finds it running:
// the E2B code interpreter's kernel, with its libraries loaded, which a
// first execution would otherwise wait a second or more for.
//
// It runs before the sandbox has an owner, so with the pool's environment.
// The claim's Init settles it in the agent before anything else reaches
// the sandbox: a create that asks to keep it (CreateRequest.KeepPrestarted)
// has the owner's environment written to its stdin as one line
// (agentproto.InitLine), which the process applies to itself; any other
// create has it killed and its Discard paths removed, so the owner finds
// only what they start, running or on disk. Nothing
// of an owner is in it before the claim, and a pooled sandbox is never
// claimed twice.
type Prestart struct {
	// Files are written first, owned by the sandbox's default user (mode
	// 0644), keyed by absolute path; missing directories are made.
	Files map[string][]byte
	// Discard are the paths made for the process (Files' directory, what
	// the process itself writes), removed with everything in them when a
	// claim does not keep it.
	Discard []string
	// Start starts the process (the pool sets Stdin, InitStdin and
	// InitDiscard).
	Start agentproto.StartRequest
	// Ready, when set, is what the process prints on stdout once it is
	// ready to serve: the sandbox joins the pool once it was printed, or
	// after prestartTimeout with the process still loading, or at once if
	// the process exits (its owner's first use starts another).
	Ready []byte
}

// prestartTimeout bounds the wait for a prestarted process's Ready (pool
// sandboxes run at the lowest CPU share; on a busy host loading takes a
// while, and the sandbox is useful without it).
var prestartTimeout = time.Minute

func exitText(ev agentproto.Event) string {
	switch {
	case ev.Signal != "":
		return ev.Signal
	case ev.ExitCode != nil:
		return strconv.Itoa(*ev.ExitCode)
	}
	return "unknown"
}

// Results of a prestart (the metric's label).
const (
	prestartReady  = "ready"
	prestartLate   = "timeout" // still loading when the sandbox joined the pool
	prestartExited = "exited"  // ended before it was ready
	prestartFailed = "failed"  // its files or its start failed
)

// prestart starts ps in the warm sandbox w and says how it went; best
// effort: a sandbox where it failed is still a good one.
func (s *Service) prestart(ctx context.Context, ps *Prestart, w *warm) string {
	ctx, cancel := context.WithTimeout(ctx, prestartTimeout)
	defer cancel()
	log := s.log.With("sandbox", w.sb.ID)
	start := time.Now()
	for path, b := range ps.Files {
		if _, err := w.agent.WriteFile(ctx, path, bytes.NewReader(b), 0o644, ""); err != nil {
			log.Warn("warm pool: prestart: write file", "path", path, "err", err)
			return prestartFailed
		}
	}
	req := ps.Start
	req.Stdin, req.InitStdin, req.InitDiscard = true, true, ps.Discard
	pid, evs, err := w.agent.Run(ctx, req)
	if err != nil {
		log.Warn("warm pool: prestart: start", "err", err)
		return prestartFailed
	}
	defer evs.Close()
	if len(ps.Ready) == 0 {
		return prestartReady
	}
	var seen []byte // stdout so far, up to its last len(Ready)-1 bytes
	for {
		ev, err := evs.Next()
		switch {
		case errors.Is(err, io.EOF):
			return prestartExited
		case err != nil:
			log.Warn("warm pool: prestarted process not ready; the sandbox joins the pool anyway", "pid", pid, "err", err, "after", time.Since(start).Round(time.Millisecond))
			return prestartLate
		}
		switch ev.Type {
		case agentproto.EventStdout:
			seen = append(seen, ev.Data...)
			if bytes.Contains(seen, ps.Ready) {
				log.Debug("warm pool: prestarted process ready", "pid", pid, "ms", time.Since(start).Milliseconds())
				return prestartReady
			}
			if keep := len(ps.Ready) - 1; len(seen) > keep {
				seen = append(seen[:0], seen[len(seen)-keep:]...)
			}
		case agentproto.EventExit:
			log.Warn("warm pool: prestarted process exited before it was ready", "pid", pid, "exit", exitText(ev))
			return prestartExited
		}
	}
}
