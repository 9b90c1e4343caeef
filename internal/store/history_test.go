package store

import (
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// TestSnapshotOnExecRecords: a sandbox's snapshot_on_exec and a snapshot's
// command are stored and read back (after reopening the file, through the
// migration's columns); a command is found by its seq (only in its own
// sandbox) and by its PID (the newest record of a reused PID).
func TestSnapshotOnExecRecords(t *testing.T) {
	ctx := t.Context()
	path := t.TempDir() + "/space.db"
	s := openTest(t, path)
	sb := newSandbox("sb1", "t1", "running")
	sb.SnapshotOnExec = true
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, newSandbox("sb2", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Process{{SandboxID: "sb1", PID: 7, Cmd: []string{"a"}}, {SandboxID: "sb2", PID: 7, Cmd: []string{"b"}}} {
		if err := s.RecordProcess(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishProcess(ctx, "sb1", 7, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 7, Cmd: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	latest, err := s.LatestProcess(ctx, "sb1", 7)
	if err != nil || latest.Cmd[0] != "c" {
		t.Fatalf("LatestProcess = %+v, %v", latest, err)
	}
	ps, _ := s.ListProcesses(ctx, "sb1")
	first, err := s.GetProcess(ctx, "sb1", ps[0].Seq)
	if err != nil || first.Cmd[0] != "a" || first.ExitCode == nil {
		t.Fatalf("GetProcess = %+v, %v", first, err)
	}
	other, _ := s.ListProcesses(ctx, "sb2")
	if _, err := s.GetProcess(ctx, "sb1", other[0].Seq); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another sandbox's command by seq: %v", err)
	}
	if _, err := s.LatestProcess(ctx, "sb1", 99); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown pid: %v", err)
	}
	if err := s.CreateSnapshot(ctx, Snapshot{ID: "snap-1", SandboxID: "sb1", Team: "t1", Kind: "files", Status: SnapshotReady,
		CreatedAt: time.Now(), Automatic: true, CommandSeq: first.Seq, Cause: "echo hi > f"}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = openTest(t, path)
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil || !got.SnapshotOnExec {
		t.Errorf("sandbox after reopen: %+v, %v", got, err)
	}
	if got, _ := s.GetSandbox(ctx, "sb2"); got.SnapshotOnExec {
		t.Error("snapshot_on_exec set on a sandbox created without it")
	}
	sn, err := s.GetSnapshot(ctx, "snap-1")
	if err != nil || sn.CommandSeq != first.Seq || sn.Cause != "echo hi > f" {
		t.Errorf("snapshot after reopen: %+v, %v", sn, err)
	}
}
