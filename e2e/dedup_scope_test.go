package e2e

import (
	"strconv"
	"testing"
)

// TestDedupOracleAcrossTeams: chunks are deduplicated within a team, never
// across teams (issue 34). Team B writes a file identical to one in team
// A's sandbox: its files snapshot pays for the file as for one never seen
// (bytes_new is no longer 0), so bytes_new cannot confirm a guess at
// another team's content. It also logs what scoping costs: each team's
// first checkpoint of the same template stores that template's memory.
func TestDedupOracleAcrossTeams(t *testing.T) {
	s := sharedServer(t)
	keyA, keyB := s.teamKey("dedup-a"), s.teamKey("dedup-b")
	create := func(key string) string {
		t.Helper()
		var sb sandboxView
		if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
			t.Fatalf("create: %d %+v", code, sb)
		}
		t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+sb.ID, key, nil, nil) })
		return sb.ID
	}
	// write puts 1 MB of incompressible bytes from seed at a known path.
	write := func(key, id string, seed int) {
		t.Helper()
		script := "import random; random.seed(" + strconv.Itoa(seed) + "); open('/home/user/secret.bin','wb').write(random.randbytes(1000000))"
		var r execResult
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", key, map[string]any{"cmd": []string{"python3", "-c", script}}, &r); code != 200 || r.ExitCode != 0 {
			t.Fatalf("write file: %d %+v", code, r)
		}
	}
	snap := func(key, id, kind string) snapshotView {
		t.Helper()
		var sn snapshotView
		if code := s.do("POST", "/v1/sandboxes/"+id+"/snapshots", key, map[string]string{"kind": kind}, &sn); code != 201 || sn.Status != "ready" {
			t.Fatalf("snapshot %s: %d %+v", kind, code, sn)
		}
		return sn
	}

	a := create(keyA)
	write(keyA, a, 1)
	sa := snap(keyA, a, "files")
	if sa.BytesNew < 1e6 {
		t.Fatalf("team a's snapshot of 1 MB of random bytes: bytes_new %d", sa.BytesNew)
	}
	// Team B: the same file, and (the baseline) a file it never saw.
	same, fresh := create(keyB), create(keyB)
	write(keyB, same, 1)
	write(keyB, fresh, 2)
	sSame, sFresh := snap(keyB, same, "files"), snap(keyB, fresh, "files")
	t.Logf("files snapshot bytes_new: team a %d; team b, same file %d, unseen file %d", sa.BytesNew, sSame.BytesNew, sFresh.BytesNew)
	if d := sSame.BytesNew - sFresh.BytesNew; sSame.BytesNew < 1e6 || d < -20000 || d > 20000 {
		t.Errorf("team b storing team a's file: bytes_new %d, an unseen file %d: cross-team dedup shows", sSame.BytesNew, sFresh.BytesNew)
	}
	// Within team B dedup still works: the same file again is nearly free.
	again := create(keyB)
	write(keyB, again, 1)
	if sn := snap(keyB, again, "files"); sn.BytesNew > 100000 {
		t.Errorf("team b's own file again: bytes_new %d, want it deduplicated", sn.BytesNew)
	}

	// The cost: first checkpoints per team of the same template.
	ca := snap(keyA, create(keyA), "checkpoint")
	ca2 := snap(keyA, create(keyA), "checkpoint")
	cb := snap(keyB, create(keyB), "checkpoint")
	t.Logf("checkpoint bytes_new: team a first %d, team a second sandbox %d, team b first %d", ca.BytesNew, ca2.BytesNew, cb.BytesNew)
}
