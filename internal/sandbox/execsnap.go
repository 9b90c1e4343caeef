package sandbox

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/store"
)

// A sandbox created with snapshot_on_exec gets an automatic files
// snapshot after every command whose end the server sees (a followed exec
// or run: the stream that delivers the exit), unless the command changed
// no file. The snapshot names the command (its process record's seq and
// its command line), so the timeline reads as the session's history, and
// is taken before the exit is handed on: a caller that runs its commands
// one after another gets each command's snapshot before it starts the
// next, so "the newest snapshot before command N started" is exactly the
// files as command N found them (RestoreBefore, FileHistory).

// snapshotOnExec says whether sb takes a snapshot after each command.
func (s *Service) snapshotOnExec(sb store.Sandbox) bool {
	return s.snaps != nil && sb.SnapshotOnExec
}

// snapCause is what an automatic snapshot was taken after.
type snapCause struct {
	seq  int64
	text string
}

// causeText is the timeline's line for a command: its shell string, or
// its argv joined by spaces, cut to store.MaxCauseBytes on a character
// boundary.
func causeText(cmd []string) string {
	line := strings.Join(cmd, " ")
	if len(cmd) == 3 && cmd[0] == "/bin/bash" && cmd[1] == "-lc" {
		line = cmd[2]
	}
	if len(line) <= store.MaxCauseBytes {
		return line
	}
	cut := store.MaxCauseBytes - len("…")
	for cut > 0 && !utf8.RuneStart(line[cut]) {
		cut--
	}
	return line[:cut] + "…"
}

// snapshotAfterExec takes the snapshot after the command pid of sandbox id
// ended and returns the command's id (0 if it is not recorded). Failures
// are logged, never handed to the command's caller: the command itself
// succeeded. A second stream of the same command (a reconnect) finds its
// snapshot already taken.
func (s *Service) snapshotAfterExec(ctx context.Context, id string, pid int) int64 {
	ctx = context.WithoutCancel(ctx)
	s.procs.flush() // its start is in the store, with its seq
	p, err := s.store.LatestProcess(ctx, id, pid)
	if err != nil {
		s.log.Warn("snapshot on exec: command not recorded", "sandbox", id, "pid", pid, "err", err)
		return 0
	}
	s.mu.Lock()
	l := s.live[id]
	s.mu.Unlock()
	if l == nil {
		return p.Seq
	}
	l.opMu.Lock()
	defer l.opMu.Unlock()
	// Under the lock: a pause or stop that ran meanwhile wins.
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil || sb.State != StateRunning {
		return p.Seq
	}
	snaps, err := s.store.ListSnapshots(ctx, id, store.SnapshotReady)
	if err != nil {
		return p.Seq
	}
	var prev *store.Snapshot
	if len(snaps) > 0 {
		prev = &snaps[len(snaps)-1]
		if prev.CommandSeq == p.Seq {
			return p.Seq
		}
	}
	sn, err := s.takeSnapshotCause(ctx, sb, KindFiles, "", true, snapCause{seq: p.Seq, text: causeText(p.Cmd)})
	if err != nil {
		s.log.Warn("snapshot on exec failed", "sandbox", id, "command", p.Seq, "err", err)
		return p.Seq
	}
	if s.unchangedSince(prev, sn) {
		_ = s.dropSnapshot(ctx, sn)
	}
	return p.Seq
}

// unchangedSince reports whether sn holds the files prev does (with no
// prev: the template's, an empty writable layer).
func (s *Service) unchangedSince(prev *store.Snapshot, sn store.Snapshot) bool {
	if prev != nil {
		return s.sameLayer(*prev, sn)
	}
	m, err := s.snaps.Store.Open(sn.ID)
	return err == nil && len(m.Entries) == 0
}

// wantSnapshotOnExec is a create's snapshot_on_exec: asked for, or the
// server's default.
func (s *Service) wantSnapshotOnExec(asked *bool) bool {
	if asked != nil {
		return *asked
	}
	return s.snaps != nil && s.snaps.OnExec
}

// baselineBeforeExec gives a snapshot_on_exec sandbox, before its first
// command starts, a snapshot of its files as that command finds them
// (unless its timeline has one already), so that "before the first
// command" can be restored and a file's first change is seen as one. Once
// per attachment: later commands find it at once.
func (s *Service) baselineBeforeExec(ctx context.Context, sb store.Sandbox, l *live) {
	if !s.snapshotOnExec(sb) || l.baselined.Load() {
		return
	}
	ctx = context.WithoutCancel(ctx)
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if l.baselined.Load() {
		return
	}
	if snaps, err := s.store.ListSnapshots(ctx, sb.ID, store.SnapshotReady); err != nil || len(snaps) > 0 {
		l.baselined.Store(err == nil)
		return
	}
	if _, err := s.takeSnapshotCause(ctx, sb, KindFiles, "", true, snapCause{text: "before the first command"}); err != nil {
		s.log.Warn("snapshot before the first command failed", "sandbox", sb.ID, "err", err)
		return
	}
	l.baselined.Store(true)
}

// CommandID is the id (Command.ID) of the command whose events ev
// streams, once its exit has been read, when the server looked it up: in a
// snapshot_on_exec sandbox, where the snapshot after it names it. 0
// otherwise (the id is in the sandbox's command list either way).
func CommandID(ev EventStream) int64 {
	if r, ok := ev.(*recordingStream); ok {
		return r.cmdID
	}
	return 0
}
