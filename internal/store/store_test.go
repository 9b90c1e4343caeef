package store

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/errdefs"
)

func openTest(t *testing.T, path string) *Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "space.db")
	}
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newSandbox(id, team, state string) Sandbox {
	return Sandbox{ID: id, Team: team, State: state, Template: "base", Driver: "gvisor",
		Env: map[string]string{"A": "1"}, Metadata: map[string]string{"owner": "me"}, CPU: 2, MemoryMB: 512,
		TimeoutS: 300, OnTimeout: "kill"}
}

func TestKeys(t *testing.T) { forBackends(t, testKeys) }

func testKeys(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	h := sha256.Sum256([]byte("secret"))
	k := Key{ID: "k1", Hash: h[:], Team: "t1", Admin: true, Name: "ci"}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, Key{ID: "k2", Hash: h[:], Team: "t2"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate hash: got %v, want conflict", err)
	}
	if err := s.CreateKey(ctx, Key{ID: "k1", Hash: []byte("x"), Team: "t2"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate id: got %v, want conflict", err)
	}
	if err := s.CreateKey(ctx, Key{ID: "k3", Team: "t2"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no hash: got %v, want invalid argument", err)
	}
	got, err := s.KeyByHash(ctx, h[:])
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "k1" || !got.Admin || got.Team != "t1" || got.Name != "ci" || !bytes.Equal(got.Hash, h[:]) || got.CreatedAt.IsZero() {
		t.Fatalf("KeyByHash = %+v", got)
	}
	if _, err := s.KeyByHash(ctx, []byte("nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing key: got %v", err)
	}
	if err := s.CreateKey(ctx, Key{ID: "k4", Hash: []byte("h4"), Team: "t2"}); err != nil {
		t.Fatal(err)
	}
	if ks, _ := s.ListKeys(ctx, "t1"); len(ks) != 1 || ks[0].ID != "k1" {
		t.Fatalf("ListKeys(t1) = %+v", ks)
	}
	if ks, _ := s.ListKeys(ctx, ""); len(ks) != 2 {
		t.Fatalf("ListKeys() = %d keys, want 2", len(ks))
	}
	// k1 is the only admin key: it stays (nothing could manage keys after).
	if err := s.DeleteKey(ctx, "k1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete the last admin key: got %v, want conflict", err)
	}
	if err := s.CreateKey(ctx, Key{ID: "k5", Hash: []byte("h5"), Team: "t1", Admin: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteKey(ctx, "k1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete twice: got %v", err)
	}
	if err := s.DeleteKey(ctx, "k4"); err != nil {
		t.Fatalf("a team key: %v", err)
	}
}

func TestSandboxCRUD(t *testing.T) { forBackends(t, testSandboxCRUD) }

func testSandboxCRUD(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	sb := newSandbox("sb1", "t1", "running")
	sb.Handle = []byte(`{"pid":42}`)
	sb.TemplateDigest = "abc"
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, sb); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate: got %v", err)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Team != "t1" || got.State != "running" || got.Env["A"] != "1" || got.Metadata["owner"] != "me" ||
		got.CPU != 2 || got.MemoryMB != 512 || got.TimeoutS != 300 || got.OnTimeout != "kill" ||
		string(got.Handle) != `{"pid":42}` || got.TemplateDigest != "abc" || got.Driver != "gvisor" ||
		got.CreatedAt.IsZero() || !got.ExpiresAt.IsZero() || got.StoppedAt != nil {
		t.Fatalf("GetSandbox = %+v", got)
	}
	if _, err := s.GetSandbox(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: got %v", err)
	}

	if err := s.SetSandboxHandle(ctx, "sb1", []byte(`{"pid":43}`)); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute).Truncate(time.Microsecond)
	if err := s.SetSandboxExpiry(ctx, "sb1", exp); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb1")
	if string(got.Handle) != `{"pid":43}` || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("after set: handle %s expiry %v, want %v", got.Handle, got.ExpiresAt, exp)
	}
	if err := s.SetSandboxHandle(ctx, "nope", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("handle of missing: got %v", err)
	}
	if err := s.SetSandboxExpiry(ctx, "nope", exp); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("expiry of missing: got %v", err)
	}

	// Nil maps read back as empty maps.
	if err := s.CreateSandbox(ctx, Sandbox{ID: "sb2", Team: "t1", State: "creating"}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb2")
	if got.Env == nil || got.Metadata == nil || len(got.Env) != 0 {
		t.Fatalf("nil maps read back as %#v %#v", got.Env, got.Metadata)
	}

	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete twice: got %v", err)
	}
}

func TestSandboxStateCAS(t *testing.T) { forBackends(t, testSandboxStateCAS) }

func testSandboxStateCAS(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateSandboxState(ctx, "sb1", []string{"running"}, "paused", "user"); err != nil {
		t.Fatal(err)
	}
	err := s.UpdateSandboxState(ctx, "sb1", []string{"running"}, "paused", "user")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sandbox is paused") {
		t.Fatalf("CAS from wrong state: got %v, want conflict naming paused", err)
	}
	if err := s.UpdateSandboxState(ctx, "nope", []string{"running"}, "paused", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("CAS on missing: got %v", err)
	}
	got, _ := s.GetSandbox(ctx, "sb1")
	if got.State != "paused" || got.Reason != "user" || got.StoppedAt != nil {
		t.Fatalf("after pause: %+v", got)
	}
	if err := s.UpdateSandboxState(ctx, "sb1", []string{"running", "paused"}, StateStopped, "timeout"); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "sb1")
	if got.State != StateStopped || got.Reason != "timeout" || got.StoppedAt == nil || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("after stop: %+v", got)
	}
	// Empty fromStates: unconditional.
	if err := s.UpdateSandboxState(ctx, "sb1", nil, "error", "recover"); err != nil {
		t.Fatal(err)
	}
}

// Only one of many concurrent CAS calls from the same state wins.
func TestSandboxStateCASRace(t *testing.T) { forBackends(t, testSandboxStateCASRace) }

func testSandboxStateCASRace(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, conflicts := 0, 0
	for i := range 10 {
		wg.Go(func() {
			err := s.UpdateSandboxState(ctx, "sb1", []string{"running"}, "paused", fmt.Sprint(i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, errdefs.ErrConflict):
				conflicts++
			default:
				t.Errorf("CAS: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || conflicts != 9 {
		t.Fatalf("wins %d conflicts %d, want 1 and 9", wins, conflicts)
	}
}

func ids(sbs []Sandbox) string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return strings.Join(out, ",")
}

func TestListSandboxes(t *testing.T) { forBackends(t, testListSandboxes) }

func testListSandboxes(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	base := time.Now().Add(-time.Hour)
	add := func(i int, id, team, state string, md map[string]string) {
		sb := newSandbox(id, team, state)
		sb.Metadata = md
		sb.CreatedAt = base.Add(time.Duration(i) * time.Second)
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	add(1, "a", "t1", "running", map[string]string{"env": "prod", "odd key.\"$": "x"})
	add(2, "b", "t1", "paused", map[string]string{"env": "dev"})
	add(3, "c", "t1", "stopped", map[string]string{"env": "prod", "app": "web"})
	add(4, "d", "t2", "running", map[string]string{"env": "prod"})

	cases := []struct {
		name string
		f    SandboxFilter
		want string
	}{
		{"team t1", SandboxFilter{Team: "t1"}, "a,b,c"},
		{"team t2", SandboxFilter{Team: "t2"}, "d"},
		{"all teams", SandboxFilter{}, "a,b,c,d"},
		{"states", SandboxFilter{Team: "t1", States: []string{"running", "paused"}}, "a,b"},
		{"metadata", SandboxFilter{Team: "t1", Metadata: map[string]string{"env": "prod"}}, "a,c"},
		{"metadata two pairs", SandboxFilter{Metadata: map[string]string{"env": "prod", "app": "web"}}, "c"},
		{"metadata odd key", SandboxFilter{Metadata: map[string]string{"odd key.\"$": "x"}}, "a"},
		{"metadata no match", SandboxFilter{Metadata: map[string]string{"env": "qa"}}, ""},
		{"state and metadata", SandboxFilter{States: []string{"running"}, Metadata: map[string]string{"env": "prod"}}, "a,d"},
	}
	for _, c := range cases {
		got, next, err := s.ListSandboxes(ctx, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ids(got) != c.want || next != "" {
			t.Errorf("%s: got %q next %q, want %q", c.name, ids(got), next, c.want)
		}
	}

	// Pagination walks every sandbox once, in order.
	var all []string
	cursor := ""
	for pages := 0; ; pages++ {
		got, next, err := s.ListSandboxes(ctx, SandboxFilter{Limit: 3, After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids(got))
		if next == "" {
			break
		}
		cursor = next
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if strings.Join(all, "|") != "a,b,c|d" {
		t.Fatalf("pages = %q", all)
	}
	if _, _, err := s.ListSandboxes(ctx, SandboxFilter{After: "!!"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad cursor: got %v", err)
	}
}

func TestListExpired(t *testing.T) { forBackends(t, testListExpired) }

func testListExpired(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	now := time.Now()
	for _, c := range []struct {
		id     string
		expiry time.Time
		state  string
	}{
		{"past", now.Add(-time.Minute), "running"},
		{"older", now.Add(-time.Hour), "paused"},
		{"future", now.Add(time.Minute), "running"},
		{"never", time.Time{}, "running"},
		{"stopped", now.Add(-time.Minute), "running"},
	} {
		if err := s.CreateSandbox(ctx, newSandbox(c.id, "t1", c.state)); err != nil {
			t.Fatal(err)
		}
		if err := s.SetSandboxExpiry(ctx, c.id, c.expiry); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.UpdateSandboxState(ctx, "stopped", nil, StateStopped, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListExpired(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != "older,past" {
		t.Fatalf("ListExpired = %q, want older,past", ids(got))
	}
}

// TestExpireSandbox: the reaper takes a sandbox for its timeout only while
// its expiry is past and it is in a state it expires from; a timeout set
// since (the race: a client extending it as the reaper's pass reached it)
// keeps it; a timeout is only set on a running or paused sandbox (one the
// reaper took is a conflict, not a 200 for a timeout that never applies).
func TestExpireSandbox(t *testing.T) { forBackends(t, testExpireSandbox) }

func testExpireSandbox(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	now := time.Now()
	live := []string{"running", "paused"}
	if err := s.CreateSandbox(ctx, newSandbox("sb", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxExpiry(ctx, "sb", now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	// The client extends it after the reaper listed it.
	if err := s.SetSandboxTimeout(ctx, "sb", live, 600, now.Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.ExpireSandbox(ctx, "sb", live, now, "stopping", "timeout"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("expire after the timeout was extended: %v, want a conflict", err)
	}
	if sb, _ := s.GetSandbox(ctx, "sb"); sb.State != "running" {
		t.Errorf("state %s after the refused expiry", sb.State)
	}
	if err := s.ExpireSandbox(ctx, "sb", []string{"paused"}, now.Add(time.Hour), "stopping", "timeout"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("expire from a state it is not in: %v, want a conflict", err)
	}
	if err := s.ExpireSandbox(ctx, "sb", live, now.Add(time.Hour), "stopping", "timeout"); err != nil {
		t.Fatalf("expire once the expiry passed: %v", err)
	}
	if sb, _ := s.GetSandbox(ctx, "sb"); sb.State != "stopping" || sb.Reason != "timeout" {
		t.Errorf("after the expiry: %s %q", sb.State, sb.Reason)
	}
	if err := s.SetSandboxTimeout(ctx, "sb", live, 600, now.Add(time.Hour)); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a timeout on a stopping sandbox: %v, want a conflict", err)
	}
	if err := s.SetSandboxTimeout(ctx, "nope", live, 600, now); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a timeout on a missing sandbox: %v, want not found", err)
	}
}

func TestTemplates(t *testing.T) { forBackends(t, testTemplates) }

func testTemplates(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	tpl := Template{Name: "base", Status: TemplateBuilding, Recipe: []byte(`{"suite":"bookworm"}`)}
	if err := s.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	built := time.Now().Truncate(time.Microsecond)
	tpl = Template{Name: "base", Digest: "d1", Path: "/x/rootfs", Kind: "dir", SizeBytes: 1 << 20,
		Recipe: []byte(`{"suite":"bookworm"}`), Status: TemplateReady, BuiltAt: built}
	if err := s.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTemplate(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != TemplateReady || got.Digest != "d1" || got.Path != "/x/rootfs" || got.Kind != "dir" ||
		got.SizeBytes != 1<<20 || string(got.Recipe) != `{"suite":"bookworm"}` || !got.BuiltAt.Equal(built) {
		t.Fatalf("GetTemplate = %+v", got)
	}
	if err := s.PutTemplate(ctx, Template{Name: "py", Status: TemplateFailed, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, Template{Name: "bad", Status: TemplateReady, Recipe: []byte("{")}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad recipe: got %v", err)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "base" || list[1].Name != "py" || list[1].Error != "boom" || list[1].Recipe != nil {
		t.Fatalf("ListTemplates = %+v", list)
	}
	if _, err := s.GetTemplate(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: got %v", err)
	}
	if err := s.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
}

func TestProcesses(t *testing.T) { forBackends(t, testProcesses) }

func testProcesses(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "nope", PID: 1}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("process of missing sandbox: got %v", err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 7, Cmd: []string{"sleep", "1"}, Tag: "bg", Background: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 8, Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishProcess(ctx, "sb1", 7, 3, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishProcess(ctx, "sb1", 7, 3, time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("finish twice: got %v", err)
	}
	// PID reuse: a new record for 7.
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 7, Cmd: []string{"ls"}}); err != nil {
		t.Fatal(err)
	}
	ps, err := s.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("ListProcesses = %+v", ps)
	}
	p := ps[0]
	if p.PID != 7 || strings.Join(p.Cmd, " ") != "sleep 1" || p.Tag != "bg" || !p.Background ||
		p.ExitCode == nil || *p.ExitCode != 3 || p.ExitedAt == nil || p.StartedAt.IsZero() {
		t.Fatalf("process 7 = %+v", p)
	}
	if ps[1].ExitCode != nil || ps[1].ExitedAt != nil || ps[2].ExitCode != nil {
		t.Fatalf("running processes have exits: %+v", ps[1:])
	}
	// A page at a time, in order, each continuing after the last.
	var paged []int64
	for after := int64(0); ; {
		page, next, err := s.ProcessPage(ctx, "sb1", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			paged = append(paged, p.Seq)
		}
		if next == 0 {
			break
		}
		if next != page[len(page)-1].Seq {
			t.Fatalf("next %d, want the page's last seq %d", next, page[len(page)-1].Seq)
		}
		after = next
	}
	if len(paged) != 3 || paged[0] != ps[0].Seq || paged[1] != ps[1].Seq || paged[2] != ps[2].Seq || !(paged[0] < paged[1] && paged[1] < paged[2]) {
		t.Fatalf("pages gave seqs %v, want %d %d %d", paged, ps[0].Seq, ps[1].Seq, ps[2].Seq)
	}
	if page, next, err := s.ProcessPage(ctx, "sb1", 0, 3); err != nil || len(page) != 3 || next != 0 {
		t.Fatalf("a page of exactly all: %d records, next %d, %v", len(page), next, err)
	}
	// Deleting the sandbox deletes its processes.
	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	if ps, _ := s.ListProcesses(ctx, "sb1"); len(ps) != 0 {
		t.Fatalf("processes survived their sandbox: %+v", ps)
	}
}

func TestPersistenceAndMigrations(t *testing.T) { forBackends(t, testPersistenceAndMigrations) }

func testPersistenceAndMigrations(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 1}); err != nil {
		t.Fatal(err)
	}
	v1, err := s.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v1 != len(migrations) {
		t.Fatalf("schema version %d, want %d", v1, len(migrations))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for range 2 { // reopening twice applies nothing again
		s = open()
		got, err := s.GetSandbox(ctx, "sb1")
		if err != nil || got.State != "running" {
			t.Fatalf("after reopen: %+v, %v", got, err)
		}
		if v, _ := s.SchemaVersion(ctx); v != v1 {
			t.Fatalf("schema version after reopen %d, want %d", v, v1)
		}
		var rows int
		if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_version`).Scan(&rows); err != nil || rows != len(migrations) {
			t.Fatalf("schema_version rows %d (%v), want %d", rows, err, len(migrations))
		}
		// Foreign keys still on after reopen.
		if err := s.RecordProcess(ctx, Process{SandboxID: "nope", PID: 1}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("foreign keys off after reopen: %v", err)
		}
		s.Close()
	}
}

// Two Stores on one database (as two processes, or replicas, would be) and
// 20 goroutines writing at once: no SQLITE_BUSY, no lost write.
func TestConcurrentWriters(t *testing.T) { forBackends(t, testConcurrentWriters) }

func testConcurrentWriters(t *testing.T, open opener) {
	ctx := t.Context()
	stores := []*Store{open(), open()}
	const writers, each = 20, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			for i := range each {
				id := fmt.Sprintf("sb-%d-%d", w, i)
				if err := s.CreateSandbox(ctx, newSandbox(id, fmt.Sprintf("t%d", w%3), "running")); err != nil {
					t.Errorf("create %s: %v", id, err)
					return
				}
				if err := s.UpdateSandboxState(ctx, id, []string{"running"}, "paused", ""); err != nil {
					t.Errorf("update %s: %v", id, err)
					return
				}
				if err := s.RecordProcess(ctx, Process{SandboxID: id, PID: i}); err != nil {
					t.Errorf("process %s: %v", id, err)
					return
				}
				if _, _, err := s.ListSandboxes(ctx, SandboxFilter{Team: "t1", Limit: 5}); err != nil {
					t.Errorf("list: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	got, _, err := stores[0].ListSandboxes(ctx, SandboxFilter{States: []string{"paused"}, Limit: MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != writers*each {
		t.Fatalf("%d paused sandboxes, want %d", len(got), writers*each)
	}
}

// TestApplyProcessOps: a batch of starts and exits lands in one
// transaction, in order; entries for a gone sandbox or an unknown process
// are skipped without losing the rest.
func TestApplyProcessOps(t *testing.T) { forBackends(t, testApplyProcessOps) }

func testApplyProcessOps(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	ops := []ProcessOp{
		{Start: &Process{SandboxID: "sb1", PID: 5, Cmd: []string{"true"}, StartedAt: now}},
		{Start: &Process{SandboxID: "gone", PID: 6, Cmd: []string{"x"}, StartedAt: now}},
		{Exit: &ProcessExit{SandboxID: "sb1", PID: 99, ExitCode: 1, ExitedAt: now}},
		{Exit: &ProcessExit{SandboxID: "sb1", PID: 5, ExitCode: 0, ExitedAt: now}},
		{Start: &Process{SandboxID: "sb1", PID: 5, Cmd: []string{"ls"}, StartedAt: now}},
	}
	if err := s.ApplyProcessOps(ctx, ops); err != nil {
		t.Fatal(err)
	}
	ps, err := s.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].ExitCode == nil || *ps[0].ExitCode != 0 || ps[1].ExitCode != nil || ps[1].Cmd[0] != "ls" {
		t.Fatalf("processes = %+v", ps)
	}
	if gone, _ := s.ListProcesses(ctx, "gone"); len(gone) != 0 {
		t.Fatalf("process of a missing sandbox recorded: %+v", gone)
	}
}

// A database a newer binary migrated is refused, naming both versions:
// running on a schema it does not know would be a silent downgrade.
func TestNewerSchemaRefused(t *testing.T) { forDatabases(t, testNewerSchemaRefused) }

func testNewerSchemaRefused(t *testing.T, database string) {
	ctx := t.Context()
	s := openTB(t, database)
	newer := len(migrations) + 1
	if _, err := s.w.ExecContext(ctx, `INSERT INTO schema_version(version, applied_at) VALUES (?, 0)`, newer); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := OpenDatabase(ctx, database)
	if err == nil {
		s2.Close()
		t.Fatal("opened a database of a newer schema version")
	}
	if want := fmt.Sprintf("version %d is newer than this binary's %d", newer, len(migrations)); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

// A process record keeps at most MaxCmdBytes of its command (a command may
// be up to 1 MiB), the cut marked; a short command is kept as it is.
func TestProcessCmdCapped(t *testing.T) { forBackends(t, testProcessCmdCapped) }

func testProcessCmdCapped(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	if err := s.CreateSandbox(ctx, newSandbox("sb1", "t1", "running")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	long := []string{"/bin/bash", "-lc", strings.Repeat("é", 1<<19)} // 1 MiB, 2-byte characters
	many := make([]string, 100000)                                   // as many empty arguments
	short := []string{"echo", "hi"}
	if err := s.ApplyProcessOps(ctx, []ProcessOp{
		{Start: &Process{SandboxID: "sb1", PID: 1, Cmd: long, StartedAt: now}},
		{Start: &Process{SandboxID: "sb1", PID: 2, Cmd: many, StartedAt: now}},
		{Start: &Process{SandboxID: "sb1", PID: 3, Cmd: short, StartedAt: now}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: 4, Cmd: long}); err != nil {
		t.Fatal(err)
	}
	ps, err := s.ListProcesses(ctx, "sb1")
	if err != nil || len(ps) != 4 {
		t.Fatalf("ListProcesses = %d records, %v", len(ps), err)
	}
	for _, p := range []Process{ps[0], ps[1], ps[3]} {
		n := 0
		for _, a := range p.Cmd {
			n += len(a) + 1
		}
		last := p.Cmd[len(p.Cmd)-1]
		if n > MaxCmdBytes || !strings.HasSuffix(last, CmdTruncated) || !utf8.ValidString(last) {
			t.Errorf("process %d: %d bytes in %d arguments, last ends %q; want at most %d, marked", p.PID, n, len(p.Cmd), last[max(0, len(last)-20):], MaxCmdBytes)
		}
		if !slices.Equal(CapCmd(p.Cmd), p.Cmd) {
			t.Errorf("process %d: a capped command capped again changes", p.PID)
		}
	}
	if p := ps[0]; p.Cmd[0] != "/bin/bash" || p.Cmd[1] != "-lc" || !strings.HasPrefix(p.Cmd[2], "éé") {
		t.Errorf("capped command lost its start: %q", p.Cmd[:2])
	}
	if !slices.Equal(ps[2].Cmd, short) {
		t.Errorf("short command stored as %q", ps[2].Cmd)
	}
}

// A sandbox keeps its newest MaxProcessesPerSandbox process records: the
// transaction that records a start deletes the oldest beyond them, and
// another sandbox's records are not touched.
func TestProcessesTrimmed(t *testing.T) { forBackends(t, testProcessesTrimmed) }

func testProcessesTrimmed(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	for _, id := range []string{"sb1", "sb2"} {
		if err := s.CreateSandbox(ctx, newSandbox(id, "t1", "running")); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	if err := s.RecordProcess(ctx, Process{SandboxID: "sb2", PID: 1, Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	// In batches as the process log writes them, the last ones alone.
	total := MaxProcessesPerSandbox + 10
	for pid := 1; pid <= total; {
		var ops []ProcessOp
		for n := 0; n < 100 && pid <= total-5; n++ {
			ops = append(ops, ProcessOp{Start: &Process{SandboxID: "sb1", PID: pid, Cmd: []string{"true"}, StartedAt: now}})
			pid++
		}
		if len(ops) == 0 {
			if err := s.RecordProcess(ctx, Process{SandboxID: "sb1", PID: pid, Cmd: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
			pid++
			continue
		}
		if err := s.ApplyProcessOps(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := s.ListProcesses(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != MaxProcessesPerSandbox || ps[0].PID != 11 || ps[len(ps)-1].PID != total {
		t.Fatalf("%d records, PIDs %d to %d; want the newest %d, 11 to %d", len(ps), ps[0].PID, ps[len(ps)-1].PID, MaxProcessesPerSandbox, total)
	}
	if other, _ := s.ListProcesses(ctx, "sb2"); len(other) != 1 {
		t.Fatalf("another sandbox's records: %d, want 1", len(other))
	}
	if s.pg {
		return // the plan below is SQLite's
	}
	// The trim reads the index, never the table.
	rows, err := s.r.QueryContext(ctx, `EXPLAIN QUERY PLAN `+trimProcessesSQL, "sb1", "sb1", MaxProcessesPerSandbox)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if p := strings.Join(plan, "; "); strings.Contains(p, "SCAN") || strings.Count(p, "COVERING INDEX processes_sandbox_seq") != 2 {
		t.Errorf("trim plan: %s", p)
	}
}
