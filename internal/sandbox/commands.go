package sandbox

import (
	"context"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Command is one process started in a sandbox through the API (exec, a
// shell command, a terminal, E2B's commands and kernels), as the server
// recorded it: who ran what, when, and how it ended. Unlike the agent's
// process list it is kept as long as the sandbox's record, after the
// sandbox stopped too.
type Command struct {
	// ID is the command's number in the server's record (unique on this
	// server, increasing): what snapshots taken after a command name
	// (snapshot_on_exec) and what restore's before_command takes.
	ID         int64      `json:"id"`
	PID        int        `json:"pid"`
	Cmd        []string   `json:"cmd"`
	Tag        string     `json:"tag,omitempty"`
	Background bool       `json:"background"`
	StartedAt  time.Time  `json:"started_at"`
	ExitCode   *int       `json:"exit_code,omitempty"` // -1: ended by a signal
	ExitedAt   *time.Time `json:"exited_at,omitempty"`
	// State: "exited"; "running"; "unknown" when its end was never seen
	// (it ran in the background and the sandbox stopped, or its agent did
	// not say).
	State string `json:"state"`
}

// Command states.
const (
	CommandExited  = "exited"
	CommandRunning = "running"
	CommandUnknown = "unknown"
)

// MaxCommandsPage is the most Commands returns at once.
const MaxCommandsPage = 1000

// Commands returns up to limit (1 to MaxCommandsPage) commands started in
// a sandbox of the caller's, oldest first, from after cursor ("" for the
// first), and the cursor of the next page ("" after the last). For a
// running sandbox, the ends its agent knows of and the server had not
// seen (a background command nobody followed) are filled in and recorded.
// Errors: errdefs.ErrNotFound, errdefs.ErrInvalidArgument (limit, cursor).
func (s *Service) Commands(ctx context.Context, c Caller, id, cursor string, limit int) ([]Command, string, error) {
	if limit < 1 || limit > MaxCommandsPage {
		return nil, "", errdefs.InvalidArgument("limit: between 1 and %d", MaxCommandsPage)
	}
	var after int64
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n < 1 {
			return nil, "", errdefs.InvalidArgument("cursor: give the next_cursor of the page before")
		}
		after = n
	}
	sb, err := s.get(ctx, c, id)
	if err != nil {
		return nil, "", err
	}
	// What was added a moment ago is in the store before it is read.
	s.procs.flush()
	recs, next, err := s.store.ProcessPage(ctx, id, after, limit)
	if err != nil {
		return nil, "", err
	}
	agentSays := s.openEnds(ctx, c, sb, recs)
	out := make([]Command, 0, len(recs))
	for i, r := range recs {
		cmd := Command{ID: r.Seq, PID: r.PID, Cmd: r.Cmd, Tag: r.Tag, Background: r.Background, StartedAt: r.StartedAt, ExitCode: r.ExitCode, ExitedAt: r.ExitedAt}
		switch {
		case r.ExitCode != nil:
			cmd.State = CommandExited
		case agentSays[i] == nil:
			cmd.State = CommandUnknown
		case agentSays[i].Running:
			cmd.State = CommandRunning
		default:
			p := agentSays[i]
			code := -1
			if p.ExitCode != nil {
				code = *p.ExitCode
			}
			at := time.Now().UTC()
			if p.ExitedAt != nil {
				at = p.ExitedAt.UTC()
			}
			cmd.ExitCode, cmd.ExitedAt, cmd.State = &code, &at, CommandExited
			s.procs.add(store.ProcessOp{Exit: &store.ProcessExit{SandboxID: id, PID: r.PID, ExitCode: code, ExitedAt: at}})
		}
		out = append(out, cmd)
	}
	nextCursor := ""
	if next > 0 {
		nextCursor = strconv.FormatInt(next, 10)
	}
	return out, nextCursor, nil
}

// openEnds asks a running sandbox's agent about the records without an
// exit: for each, the agent's entry of its PID if that entry is the same
// process (started at the same time). Nothing for a sandbox that is
// not running (a paused one is not woken) or whose agent does not answer
// within a second.
func (s *Service) openEnds(ctx context.Context, c Caller, sb store.Sandbox, recs []store.Process) []*agentproto.Process {
	out := make([]*agentproto.Process, len(recs))
	open := false
	for _, r := range recs {
		open = open || r.ExitCode == nil
	}
	if !open || sb.State != StateRunning {
		return out
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, l, err := s.liveOf(actx, c, sb.ID, StateRunning)
	if err != nil {
		return out
	}
	procs, err := l.agent.Processes(actx)
	if err != nil {
		return out
	}
	byPID := map[int]*agentproto.Process{}
	for i := range procs {
		byPID[procs[i].PID] = &procs[i]
	}
	for i, r := range recs {
		p := byPID[r.PID]
		if r.ExitCode == nil && p != nil && p.StartedAt.Sub(r.StartedAt).Abs() < sameStart {
			out[i] = p
		}
	}
	return out
}

// sameStart is how far apart the server's and the agent's start times of
// one process may be (the request's round trip, and a guest clock stepped
// at restore): an entry of the same PID outside it is another process that
// got the PID later.
const sameStart = 5 * time.Second
