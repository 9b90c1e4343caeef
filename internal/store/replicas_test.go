package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Two Stores on one database (two control-plane replicas) admitting
// creates and claims of one team at once: the quota holds across them,
// never over, and every refusal is the quota's.
func TestQuotaAcrossReplicas(t *testing.T) { forBackends(t, testQuotaAcrossReplicas) }

func testQuotaAcrossReplicas(t *testing.T, open opener) {
	ctx := t.Context()
	replicas := []*Store{open(), open()}
	const pooled, creates, limit = 30, 30, 17
	createPooled(t, replicas[0], pooled)
	q := Quota{MaxSandboxes: limit, MaxMemoryMB: limit * 512}
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range pooled + creates {
		wg.Go(func() {
			s := replicas[i%2]
			<-start
			var err error
			if i < pooled {
				err = s.ClaimSandboxWithin(ctx, newSandbox(fmt.Sprint("pool", i), "t1", "running"), q)
			} else {
				err = s.CreateSandboxWithin(ctx, newSandbox(fmt.Sprint("sb", i), "t1", "creating"), q)
			}
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrQuotaExceeded):
				refused.Add(1)
			default:
				t.Errorf("admission %d: %v", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != limit || refused.Load() != pooled+creates-limit {
		t.Errorf("%d admitted, %d refused; want %d and %d", ok.Load(), refused.Load(), limit, pooled+creates-limit)
	}
	for _, s := range replicas {
		if u, err := s.TeamUsage(ctx, "t1"); err != nil || u.Sandboxes != limit || u.MemoryMB != limit*512 {
			t.Errorf("usage %+v, %v; want %d sandboxes, %d MiB", u, err, limit, limit*512)
		}
	}
}

// A sandbox's state compare-and-set holds across replicas: of many
// concurrent moves from one state, through two Stores, one wins.
func TestStateCASAcrossReplicas(t *testing.T) { forBackends(t, testStateCASAcrossReplicas) }

func testStateCASAcrossReplicas(t *testing.T, open opener) {
	ctx := t.Context()
	replicas := []*Store{open(), open()}
	const rounds, racers = 5, 8
	for r := range rounds {
		id := fmt.Sprint("sb", r)
		if err := replicas[0].CreateSandbox(ctx, newSandbox(id, "t1", "running")); err != nil {
			t.Fatal(err)
		}
		var wins, conflicts atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				<-start
				err := replicas[i%2].UpdateSandboxState(ctx, id, []string{"running"}, "stopping", fmt.Sprint(i))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, errdefs.ErrConflict):
					conflicts.Add(1)
				default:
					t.Errorf("CAS: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 || conflicts.Load() != racers-1 {
			t.Errorf("round %d: %d wins, %d conflicts; want 1 and %d", r, wins.Load(), conflicts.Load(), racers-1)
		}
	}
}

// Replicas starting together on a fresh database migrate it once: every
// one opens, and each migration is recorded once.
func TestMigrateTogether(t *testing.T) { forDatabases(t, testMigrateTogether) }

func testMigrateTogether(t *testing.T, database string) {
	const n = 4
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = OpenDatabase(t.Context(), database)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	var rows, versions int
	if err := stores[0].r.QueryRowContext(t.Context(), `SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_version`).Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if rows != len(migrations) || versions != len(migrations) {
		t.Fatalf("schema_version holds %d rows of %d versions, want %d of %d", rows, versions, len(migrations), len(migrations))
	}
}

// Lists are ordered bytewise on both backends (SQLite's order): "B" before
// "a", as the cursors of ListSandboxes assume. The Postgres test cluster's
// default collation is a natural-language one (pgtest), under which "a"
// would come first.
func TestListOrderBytewise(t *testing.T) { forBackends(t, testListOrderBytewise) }

func testListOrderBytewise(t *testing.T, open opener) {
	ctx := t.Context()
	s := open()
	at := time.Now() // one instant: ordered by id alone
	for _, id := range []string{"b", "a", "B", "_x", "A"} {
		sb := newSandbox(id, "t1", "running")
		sb.CreatedAt = at
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	var pages []string
	for cursor := ""; ; {
		got, next, err := s.ListSandboxes(ctx, SandboxFilter{Limit: 2, After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, ids(got))
		if next == "" {
			break
		}
		cursor = next
	}
	if got := fmt.Sprint(pages); got != "[A,B _x,a b]" {
		t.Errorf("pages %s, want [A,B _x,a b] (bytewise)", got)
	}
	for _, name := range []string{"b", "B", "a"} {
		if err := s.PutTemplate(ctx, Template{Name: name, Status: TemplateReady}); err != nil {
			t.Fatal(err)
		}
	}
	ts, err := s.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 3 || ts[0].Name != "B" || ts[1].Name != "a" || ts[2].Name != "b" {
		t.Errorf("templates %+v, want B, a, b", ts)
	}
}
