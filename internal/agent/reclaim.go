package agent

import (
	"bytes"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
)

// handleReclaim frees memory when the host saw the sandbox reach its
// memory limit: it kills the process with the largest resident memory,
// as a kernel's OOM killer would. Under gVisor the host's own OOM killer
// would take the whole sandbox instead (the host's hard limit sits above
// the sandbox's, so this has time to act). A process started through the
// agent that is killed this way reports error "oom" in its exit event.
func (a *Agent) handleReclaim(w http.ResponseWriter, r *http.Request) {
	victim := largestProcess(os.Getpid())
	if victim.PID == 0 {
		writeJSON(w, victim)
		return
	}
	a.mu.Lock()
	p := a.procs[victim.PID]
	a.mu.Unlock()
	if p != nil {
		p.oomKilled.Store(true)
	}
	if err := unix.Kill(victim.PID, unix.SIGKILL); err != nil {
		writeJSON(w, agentproto.ReclaimResponse{}) // it exited meanwhile: its memory is being freed anyway
		return
	}
	a.log.Warn("memory limit reached: killed the largest process", "pid", victim.PID, "cmd", victim.Cmd, "rss", victim.RSS)
	writeJSON(w, victim)
}

// largestProcess returns the descendant of self with the most resident
// memory (PID 0: none has any). Under gVisor the agent is PID 1 and every
// process is its descendant; elsewhere (tests) nothing else is touched.
func largestProcess(self int) agentproto.ReclaimResponse {
	var best agentproto.ReclaimResponse
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return best
	}
	parent := map[int]int{}
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if ppid := parentOf(pid); ppid > 0 {
				parent[pid] = ppid
			}
		}
	}
	// Whether each pid descends from self, memoised: the whole chain is
	// walked, however deep (a walk cut at 64 levels hid a process nested
	// deeper from the kill that protects the sandbox); a cycle (pids
	// reused while /proc was read) is no descent.
	known := map[int]bool{}
	descends := func(pid int) bool {
		var chain []int
		seen := map[int]bool{}
		res := false
		for {
			if v, ok := known[pid]; ok {
				res = v
				break
			}
			ppid, ok := parent[pid]
			if !ok || seen[pid] {
				break
			}
			seen[pid] = true
			chain = append(chain, pid)
			if ppid == self {
				res = true
				break
			}
			pid = ppid
		}
		for _, c := range chain {
			known[c] = res
		}
		return res
	}
	page := int64(os.Getpagesize())
	for pid := range parent {
		if !descends(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
		if err != nil {
			continue // gone
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		pages, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || pages*page <= best.RSS {
			continue
		}
		best = agentproto.ReclaimResponse{PID: pid, RSS: pages * page, Cmd: cmdline(pid)}
	}
	return best
}

// parentOf returns a process's parent pid from /proc (0 when unknown).
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the parenthesised command name: state, ppid, …
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// cmdline returns a process's command line, space-separated and bounded.
func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	b = bytes.TrimRight(b, "\x00")
	s := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
