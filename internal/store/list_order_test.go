package store

import (
	"slices"
	"testing"
	"time"
)

// TestListSandboxesNewestFirst: Newest lists the newest first, and paging
// with the cursor continues that order to the end, with the template and
// created-from filters applied before the pages are cut (E2B's list).
func TestListSandboxesNewestFirst(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, "")
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	// Two sandboxes share a creation time: the id breaks the tie.
	at := []int{1, 2, 3, 3, 4, 5, 6}
	ids := []string{"a", "b", "c", "d", "e", "f", "g"}
	for i, id := range ids {
		sb := newSandbox(id, "t1", "running")
		if id == "e" || id == "g" {
			sb.Template = "python-data"
		}
		sb.CreatedAt = base.Add(time.Duration(at[i]) * time.Second)
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	pages := func(f SandboxFilter) (got []string, n int) {
		t.Helper()
		for {
			page, next, err := s.ListSandboxes(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			n++
			for _, sb := range page {
				got = append(got, sb.ID)
			}
			if next == "" || n > 10 {
				return got, n
			}
			f.After = next
		}
	}
	if got, n := pages(SandboxFilter{Newest: true, Limit: 2}); !slices.Equal(got, []string{"g", "f", "e", "d", "c", "b", "a"}) || n != 4 {
		t.Errorf("newest first, 2 a page: %v in %d pages", got, n)
	}
	if got, _ := pages(SandboxFilter{Limit: 3}); !slices.Equal(got, ids) {
		t.Errorf("oldest first: %v", got)
	}
	if got, n := pages(SandboxFilter{Newest: true, Limit: 1, Templates: []string{"base"}, CreatedFrom: base.Add(3 * time.Second)}); !slices.Equal(got, []string{"f", "d", "c"}) || n != 3 {
		t.Errorf("base sandboxes created from +3s, newest first: %v in %d pages", got, n)
	}
	if got, _ := pages(SandboxFilter{Newest: true, Templates: []string{"python-data", "code-interpreter-v1"}}); !slices.Equal(got, []string{"g", "e"}) {
		t.Errorf("python-data sandboxes: %v", got)
	}
}
